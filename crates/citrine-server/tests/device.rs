//! The device storage engine over real `citrined` processes: crash safety
//! under `kill -9` during concurrent writes (with and without
//! commit-to-device), durable deletes and expirations across fast and cold
//! restarts, corrupted blocks, stop-writes that lift by themselves, and
//! eviction by `evict-used-pct`.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_testsupport::listener_is;
use citrine_wire::msg::{info1, info2, op_type, MsgHeader};
use common::*;
use std::collections::HashMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A citrined whose log goes to a file, so tests can read it.
struct Node {
    child: Child,
    log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn start(config: &Path, data_dir: &Path, port: u16, run: u32) -> Node {
        let log = data_dir.join(format!("citrined-{run}.log"));
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary())
            .args([
                "--config",
                config.to_str().unwrap(),
                "--data-dir",
                data_dir.to_str().unwrap(),
                "--port",
                &port.to_string(),
                "--fabric-port",
                &free_port().to_string(),
                "--heartbeat-port",
                &free_port().to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .spawn()
            .unwrap();
        let mut node = Node { child, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = node.child.try_wait() {
                panic!("citrined exited early with {status}: {}", node.log_text());
            }
            // Ours, not some other process that took the port.
            if listener_is(port, node.child.id()) && TcpStream::connect(("127.0.0.1", port)).is_ok()
            {
                return node;
            }
            assert!(
                Instant::now() < deadline,
                "citrined did not listen within 30 s: {}",
                node.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (at most 20 s) until the log has a line containing `text`.
    fn wait_for_log(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.log_text().contains(text) {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in the log: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// kill -9.
    fn kill(mut self) -> String {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.log_text()
    }

    /// SIGTERM and wait for the clean exit.
    fn terminate(mut self) -> String {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "unclean exit {status}: {}",
                    self.log_text()
                );
                return self.log_text();
            }
            assert!(
                Instant::now() < deadline,
                "citrined did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Log lines that would mean the engine's accounting went wrong.
fn assert_no_anomaly(log: &str) {
    for anomaly in [
        "defrag cannot move",
        "release of an address",
        "panicked",
        "flush failed",
    ] {
        assert!(!log.contains(anomaly), "log contains {anomaly:?}: {log}");
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "citrine-device-{name}-{}-{}",
        std::process::id(),
        free_port()
    ));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    path
}

fn write_config(dir: &Path, engine: &str) -> PathBuf {
    let path = dir.join("citrine.toml");
    let text = format!(
        "[service]\nport = 3000\n[logging]\nlevel = \"info\"\n[[namespace]]\nname = \"test\"\nnsup-period = 1\n[namespace.storage-engine]\ntype = \"device\"\n{engine}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn put(stream: &mut TcpStream, key: &str, value: i64, ttl: u32) -> std::io::Result<u8> {
    let header = MsgHeader {
        info2: info2::WRITE,
        record_ttl: ttl,
        ..MsgHeader::default()
    };
    let frame = record_request(
        "test",
        key,
        header,
        &[(op_type::WRITE, 1, "v", value.to_be_bytes().to_vec())],
    );
    let (_, body) = round_trip(stream, &frame)?;
    Ok(decode_reply(&body).0.result_code)
}

fn put_blob(stream: &mut TcpStream, key: &str, bytes: usize) -> std::io::Result<u8> {
    put_blob_ttl(stream, key, bytes, 0)
}

/// A `bytes`-byte blob in bin "b" with TTL `ttl` (0: the namespace default).
fn put_blob_ttl(stream: &mut TcpStream, key: &str, bytes: usize, ttl: u32) -> std::io::Result<u8> {
    let header = MsgHeader {
        info2: info2::WRITE,
        record_ttl: ttl,
        ..MsgHeader::default()
    };
    let frame = record_request(
        "test",
        key,
        header,
        &[(op_type::WRITE, 4, "b", vec![7u8; bytes])],
    );
    let (_, body) = round_trip(stream, &frame)?;
    Ok(decode_reply(&body).0.result_code)
}

fn delete(stream: &mut TcpStream, key: &str) -> std::io::Result<u8> {
    let header = MsgHeader {
        info2: info2::WRITE | info2::DELETE,
        ..MsgHeader::default()
    };
    let (_, body) = round_trip(stream, &record_request("test", key, header, &[]))?;
    Ok(decode_reply(&body).0.result_code)
}

/// The value of bin "v", or `None` when the record is not found.
fn get(stream: &mut TcpStream, key: &str) -> Option<i64> {
    let header = MsgHeader {
        info1: info1::READ | info1::GET_ALL,
        ..MsgHeader::default()
    };
    let (_, body) = round_trip(stream, &record_request("test", key, header, &[])).unwrap();
    let (reply, bins) = decode_reply(&body);
    match reply.result_code {
        0 => bins
            .iter()
            .find(|bin| bin.0 == b"v")
            .map(|bin| i64::from_be_bytes(bin.2.clone().try_into().unwrap())),
        2 => None,
        code => panic!("read of {key} failed with {code}"),
    }
}

fn stat(stream: &mut TcpStream, name: &str) -> String {
    let answer = info(stream, &["namespace/test"]);
    answer[0]
        .1
        .split(';')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
        .unwrap_or_default()
        .to_owned()
}

/// What a client thread knows when the server dies.
#[derive(Default)]
struct History {
    /// Acknowledged state of each key: Some(value) or None (deleted).
    acked: HashMap<String, Option<i64>>,
    /// The operation in flight when the connection broke.
    in_flight: Option<(String, Option<i64>)>,
    /// Acknowledgement times of writes (for the loss-window test).
    ack_times: Vec<(String, i64, Instant)>,
}

/// Runs `threads` clients doing writes and deletes until the server dies.
fn hammer(
    port: u16,
    threads: usize,
    keys_per_thread: u64,
    delete_every: u64,
) -> Vec<std::thread::JoinHandle<History>> {
    (0..threads)
        .map(|thread| {
            std::thread::spawn(move || {
                let mut history = History::default();
                let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
                    return history;
                };
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                for step in 1u64.. {
                    let key = format!("t{thread}-{}", (step * 7919) % keys_per_thread);
                    let deleting = delete_every != 0 && step % delete_every == 0;
                    let new_state = if deleting { None } else { Some(step as i64) };
                    history.in_flight = Some((key.clone(), new_state));
                    let outcome = if deleting {
                        delete(&mut stream, &key)
                    } else {
                        put(&mut stream, &key, step as i64, 0)
                    };
                    match outcome {
                        Ok(0) | Ok(2) => {
                            history.acked.insert(key.clone(), new_state);
                            if let Some(value) = new_state {
                                history.ack_times.push((key, value, Instant::now()));
                            }
                            history.in_flight = None;
                        }
                        Ok(code) => panic!("operation failed with result {code}"),
                        Err(_) => break,
                    }
                }
                history
            })
        })
        .collect()
}

#[test]
fn kill_9_with_commit_to_device_loses_no_acknowledged_write_or_delete() {
    let dir = temp_dir("commit");
    let config = write_config(&dir, "file = \"test.dat\"\nfilesize = \"4M\"\nwrite-block-size = \"64K\"\ncommit-to-device = true\nflush-max-ms = 100");
    let port = free_port();
    let node = Node::start(&config, &dir, port, 1);
    // Many overwrites of a small key space: blocks die and defrag runs.
    let clients = hammer(port, 8, 150, 5);
    std::thread::sleep(Duration::from_millis(1500));
    node.wait_for_log("index checkpoint written");
    std::thread::sleep(Duration::from_millis(1500));
    let mut stream = connect(port);
    let defragged = stat(&mut stream, "defrag_reads");
    drop(stream);
    assert_no_anomaly(&node.kill());
    let histories: Vec<History> = clients
        .into_iter()
        .map(|client| client.join().unwrap())
        .collect();
    let acknowledged: usize = histories.iter().map(|history| history.acked.len()).sum();
    assert!(
        acknowledged > 100,
        "too few writes to mean anything: {acknowledged}"
    );

    let node = Node::start(&config, &dir, port, 2);
    let mut stream = connect(port);
    let mut checked = 0;
    for history in &histories {
        for (key, state) in &history.acked {
            let actual = get(&mut stream, key);
            let in_flight = history
                .in_flight
                .as_ref()
                .filter(|(flying, _)| flying == key)
                .map(|(_, state)| *state);
            assert!(
                actual == *state || Some(actual) == in_flight,
                "{key}: acknowledged {state:?}, in flight {in_flight:?}, found {actual:?}"
            );
            checked += 1;
        }
    }
    let log = node.kill();
    assert!(
        log.contains("checkpoint restart complete"),
        "an unclean stop must restart from the index checkpoint: {log}"
    );
    eprintln!("checked {checked} keys after kill -9; defrag had read {defragged} blocks");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kill_9_without_commit_loses_at_most_the_flush_window() {
    let dir = temp_dir("window");
    let flush_max_ms = 200u64;
    let config = write_config(&dir, &format!("file = \"test.dat\"\nfilesize = \"64M\"\nwrite-block-size = \"128K\"\nflush-max-ms = {flush_max_ms}"));
    let port = free_port();
    let node = Node::start(&config, &dir, port, 1);
    // Unique keys, no deletes: every acknowledged write should survive unless
    // it was acknowledged within the flush window before the kill.
    let clients = hammer(port, 8, u64::MAX, 0);
    std::thread::sleep(Duration::from_millis(2500));
    let killed_at = Instant::now();
    node.kill();
    let histories: Vec<History> = clients
        .into_iter()
        .map(|client| client.join().unwrap())
        .collect();
    // Documented window: flush-max-ms, plus scheduling slack on a loaded test machine.
    let window = Duration::from_millis(flush_max_ms + 400);
    let node = Node::start(&config, &dir, port, 2);
    let mut stream = connect(port);
    let (mut old, mut recent, mut lost_recent) = (0, 0, 0);
    for history in &histories {
        for (key, value, acked_at) in &history.ack_times {
            let actual = get(&mut stream, key);
            if killed_at.duration_since(*acked_at) > window {
                assert_eq!(
                    actual,
                    Some(*value),
                    "{key} was acknowledged {:?} before the kill, outside the loss window",
                    killed_at.duration_since(*acked_at)
                );
                old += 1;
            } else {
                recent += 1;
                if actual.is_none() {
                    lost_recent += 1;
                }
            }
        }
    }
    assert!(old > 100, "too few writes: {old}");
    eprintln!("{old} writes older than the window all present; {lost_recent} of {recent} writes inside the window lost");
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn deletes_and_expirations_survive_fast_and_cold_restarts() {
    let dir = temp_dir("durable");
    let config = write_config(
        &dir,
        "file = \"test.dat\"\nfilesize = \"8M\"\nwrite-block-size = \"64K\"\nflush-max-ms = 50",
    );
    let port = free_port();
    let node = Node::start(&config, &dir, port, 1);
    let mut stream = connect(port);
    for index in 0..400 {
        assert_eq!(put(&mut stream, &format!("k{index}"), index, 0).unwrap(), 0);
    }
    for index in (0..400).step_by(2) {
        assert_eq!(delete(&mut stream, &format!("k{index}")).unwrap(), 0);
    }
    // Records that expire in 1 s, after an older copy without a TTL.
    for index in 0..50 {
        assert_eq!(put(&mut stream, &format!("e{index}"), index, 0).unwrap(), 0);
        assert_eq!(
            put(&mut stream, &format!("e{index}"), index + 1000, 1).unwrap(),
            0
        );
    }
    // Churn so that defrag moves and frees blocks holding the old copies.
    for round in 0..30 {
        for index in 0..60 {
            assert_eq!(
                put_blob(&mut stream, &format!("churn{index}"), 3000 + round).unwrap(),
                0
            );
        }
    }
    std::thread::sleep(Duration::from_millis(2500));
    node.wait_for_log("index checkpoint written");
    let check = |stream: &mut TcpStream, when: &str| {
        for index in 0..400 {
            let expected = (index % 2 == 1).then_some(index);
            assert_eq!(
                get(stream, &format!("k{index}")),
                expected,
                "k{index} {when}"
            );
        }
        for index in 0..50 {
            assert_eq!(
                get(stream, &format!("e{index}")),
                None,
                "e{index} expired but is back {when}"
            );
        }
    };
    check(&mut stream, "before any restart");
    drop(stream);
    let log = node.terminate();
    assert_no_anomaly(&log);
    assert!(log.contains("index saved for fast restart"), "{log}");

    let node = Node::start(&config, &dir, port, 2);
    let mut stream = connect(port);
    check(&mut stream, "after a fast restart");
    let log = node.kill();
    assert!(log.contains("fast restart: index reattached"), "{log}");

    let node = Node::start(&config, &dir, port, 3);
    let mut stream = connect(port);
    check(&mut stream, "after kill -9 and a checkpoint restart");
    let log = node.kill();
    assert!(log.contains("checkpoint restart complete"), "{log}");

    // A damaged checkpoint: refused with a log line, then a cold start.
    let checkpoint = dir.join("test.checkpoint");
    let mut bytes = std::fs::read(&checkpoint).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(&checkpoint, bytes).unwrap();
    let node = Node::start(&config, &dir, port, 4);
    let mut stream = connect(port);
    check(&mut stream, "after kill -9 and a cold start");
    let log = node.kill();
    assert!(
        log.contains("index checkpoint") && log.contains("rejected"),
        "{log}"
    );
    assert!(log.contains("cold start complete"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupted_block_is_skipped_with_a_log_line() {
    let dir = temp_dir("corrupt");
    let config = write_config(&dir, "file = \"test.dat\"\nfilesize = \"8M\"\nwrite-block-size = \"64K\"\ncommit-to-device = true");
    let port = free_port();
    let node = Node::start(&config, &dir, port, 1);
    let mut stream = connect(port);
    for index in 0..300 {
        assert_eq!(put(&mut stream, &format!("k{index}"), index, 0).unwrap(), 0);
    }
    drop(stream);
    node.kill();
    // Flip bytes inside the first write block (after its header) and tear
    // the header of the second.
    let path = dir.join("test.dat");
    let mut bytes = std::fs::read(&path).unwrap();
    let first_block = 1 << 20;
    for byte in &mut bytes[first_block + 2000..first_block + 2300] {
        *byte ^= 0xA5;
    }
    bytes[first_block + 65536 + 40] ^= 0xFF;
    std::fs::write(&path, &bytes).unwrap();

    let node = Node::start(&config, &dir, port, 2);
    let mut stream = connect(port);
    let found = (0..300)
        .filter(|index| get(&mut stream, &format!("k{index}")) == Some(*index))
        .count();
    assert!(found > 100 && found < 300, "found {found} of 300");
    // The node keeps serving writes.
    assert_eq!(put(&mut stream, "after", 1, 0).unwrap(), 0);
    let log = node.kill();
    assert!(
        log.contains("checksum"),
        "no log line about the corruption: {log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stop_writes_when_full_then_resume_after_deletes() {
    let dir = temp_dir("full");
    // 1 MiB reserved + 32 blocks of 64 KiB.
    let config = write_config(&dir, "file = \"test.dat\"\nfilesize = 3145728\nwrite-block-size = \"64K\"\nmin-avail-pct = 10\nflush-max-ms = 50");
    let port = free_port();
    let node = Node::start(&config, &dir, port, 1);
    let mut stream = connect(port);
    let mut written = 0;
    loop {
        match put_blob(&mut stream, &format!("f{written}"), 4000).unwrap() {
            0 => written += 1,
            8 => break,
            code => panic!("unexpected result {code}"),
        }
        assert!(written < 10_000, "never ran out of space");
    }
    assert!(written > 100);
    for index in 0..written {
        if index % 5 != 0 {
            assert_eq!(delete(&mut stream, &format!("f{index}")).unwrap(), 0);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let resumed = Arc::new(AtomicBool::new(false));
    while Instant::now() < deadline {
        if put_blob(&mut stream, "again", 4000).unwrap() == 0 {
            resumed.store(true, Ordering::Relaxed);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        resumed.load(Ordering::Relaxed),
        "writes did not resume after deletes: {}",
        stat(&mut stream, "device_available_pct")
    );
    for index in (0..written).step_by(5) {
        let header = MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            ..MsgHeader::default()
        };
        let (_, body) = round_trip(
            &mut stream,
            &record_request("test", &format!("f{index}"), header, &[]),
        )
        .unwrap();
        assert_eq!(
            decode_reply(&body).0.result_code,
            0,
            "f{index} lost by defrag"
        );
    }
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether `key` is found (any bin).
fn found(stream: &mut TcpStream, key: &str) -> bool {
    let header = MsgHeader {
        info1: info1::READ | info1::GET_ALL,
        ..MsgHeader::default()
    };
    let (_, body) = round_trip(stream, &record_request("test", key, header, &[])).unwrap();
    match decode_reply(&body).0.result_code {
        0 => true,
        2 => false,
        code => panic!("read of {key} failed with {code}"),
    }
}

/// Waits (at most 10 s) until `done` holds, saying `what` if it never does.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what} within 10 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes 4 000-byte records with rising TTLs until the live bytes pass
/// 45 % of the device; returns the next key number.
fn fill_past(stream: &mut TcpStream, mut next: u32, pct: u64) -> u32 {
    loop {
        for _ in 0..20 {
            let code = put_blob_ttl(stream, &format!("t{next}"), 4000, 3600 + next).unwrap();
            assert_eq!(code, 0, "t{next} refused before the eviction threshold");
            next += 1;
        }
        if stat(stream, "data_used_pct").parse::<u64>().unwrap() > pct {
            return next;
        }
    }
}

/// Issue 44 point 5: a device namespace evicts its soonest-expiring
/// records at `evict-used-pct`, stops writes with 8 when free blocks fall
/// below `stop-writes-avail-pct` (records that never expire fill it),
/// keeps serving reads, and its evictions survive a cold restart (their
/// tombstones are on the device).
#[test]
fn a_device_namespace_evicts_then_stops_writes_and_keeps_reading() {
    let dir = temp_dir("evict");
    // 1 MiB reserved + 64 blocks of 64 KiB; nsup every second.
    let config = write_config(&dir, "file = \"test.dat\"\nfilesize = 5242880\nwrite-block-size = \"64K\"\nflush-max-ms = 50\nevict-used-pct = 40\nstop-writes-used-pct = 0\nstop-writes-avail-pct = 25\nfast-restart = false");
    let port = free_port();
    let node = Node::start(&config, &dir, port, 1);
    let mut stream = connect(port);
    // One pass may evict every record it needs to (the default,
    // evict-tenths-pct 5, allows 0.5 % of them a pass).
    let set = "set-config:context=namespace;id=test;evict-tenths-pct=1000";
    assert_eq!(info(&mut stream, &[set])[0].1, "ok");
    let mut next = 0;
    for round in 1..=2u64 {
        next = fill_past(&mut stream, next, 45);
        wait_until("no eviction back under evict-used-pct", || {
            stat(&mut stream, "data_used_pct").parse::<u64>().unwrap() < 40
        });
        let evicted: u64 = stat(&mut stream, "evicted_objects").parse().unwrap();
        assert!(evicted >= 20 * round, "round {round}: evicted {evicted}");
    }
    // Soonest to expire went first: the first records, not the last.
    assert!(!found(&mut stream, "t0"), "t0 survived eviction");
    assert!(
        found(&mut stream, &format!("t{}", next - 1)),
        "the newest was evicted"
    );
    // Records that never expire cannot be evicted: writes stop.
    let mut written = 0u32;
    let code = loop {
        match put_blob(&mut stream, &format!("n{written}"), 4000).unwrap() {
            0 => written += 1,
            code => break code,
        }
        assert!(written < 5000, "writes never stopped");
    };
    assert_eq!(code, 8, "stop-writes answers OUT_OF_SPACE");
    assert_eq!(stat(&mut stream, "stop_writes"), "true");
    let avail: u64 = stat(&mut stream, "data_avail_pct").parse().unwrap();
    assert!(avail < 25, "stopped with {avail}% free");
    assert!(found(&mut stream, "n0") && found(&mut stream, &format!("n{}", written - 1)));
    let before: Vec<bool> = (0..next)
        .map(|i| found(&mut stream, &format!("t{i}")))
        .collect();
    assert!(before.iter().any(|kept| !kept));
    let log = node.terminate();
    assert_no_anomaly(&log);
    // Cold start: the evicted records stay gone.
    let node = Node::start(&config, &dir, port, 2);
    let mut stream = connect(port);
    for (index, kept) in before.iter().enumerate() {
        let key = format!("t{index}");
        assert!(
            *kept || !found(&mut stream, &key),
            "{key} came back after a cold restart"
        );
    }
    assert!(found(&mut stream, &format!("n{}", written - 1)));
    let tombstones: u64 = stat(&mut stream, "device_tombstones").parse().unwrap();
    assert!(
        tombstones > 0,
        "no eviction tombstone read back from the device"
    );
    eprintln!(
        "evicted {}, {written} records without TTL until 8, {avail}% free, {tombstones} tombstones after restart",
        before.iter().filter(|kept| !**kept).count()
    );
    assert_no_anomaly(&node.terminate());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The values of bin "v" a secondary-index query on it returns for
/// `begin..=end` (every record once).
fn query_v(stream: &mut TcpStream, begin: i64, end: i64) -> Vec<i64> {
    use citrine_wire::msg::{field_type, info3, MessageWriter};
    let header = MsgHeader {
        info1: info1::READ,
        info3: info3::PARTITION_DONE,
        transaction_ttl: 5000,
        ..MsgHeader::default()
    };
    let mut range = vec![1u8, 1, b'v', 1];
    for value in [begin, end] {
        range.extend_from_slice(&8u32.to_be_bytes());
        range.extend_from_slice(&value.to_be_bytes());
    }
    let mut frame = Vec::new();
    let mut writer = MessageWriter::begin(&mut frame, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::TASK_ID, &9u64.to_be_bytes())
        .field(field_type::INDEX_RANGE, &range);
    writer.finish();
    std::io::Write::write_all(stream, &frame).unwrap();
    let (messages, _) = stream::read_stream(stream);
    let (last, records) = messages.split_last().unwrap();
    assert_eq!(last.header.result_code, 0, "query refused");
    let mut values: Vec<i64> = records
        .iter()
        .map(|record| {
            let (_, value) = record.bins.iter().find(|(name, _)| name == b"v").unwrap();
            i64::from_be_bytes(value.clone().try_into().unwrap())
        })
        .collect();
    values.sort_unstable();
    values
}

#[test]
fn secondary_indexes_survive_fast_and_cold_restarts() {
    let dir = temp_dir("sindex");
    let config = write_config(
        &dir,
        "file = \"test.dat\"\nfilesize = \"8M\"\nwrite-block-size = \"64K\"\nflush-max-ms = 50",
    );
    let port = free_port();
    let node = Node::start(&config, &dir, port, 1);
    let mut stream = connect(port);
    for index in 0..300 {
        assert_eq!(put(&mut stream, &format!("k{index}"), index, 0).unwrap(), 0);
    }
    let create = "sindex-create:namespace=test;indexname=by_v;bin=v;type=NUMERIC";
    assert_eq!(info(&mut stream, &[create])[0].1, "ok");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !info(&mut stream, &["sindex/test/by_v"])[0]
        .1
        .contains("load_pct=100;")
    {
        assert!(Instant::now() < deadline, "the index was not built");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Changes after the build: deletes, and values moved out of the range.
    for index in (0..300).step_by(3) {
        assert_eq!(delete(&mut stream, &format!("k{index}")).unwrap(), 0);
    }
    for index in (1..300).step_by(3) {
        assert_eq!(
            put(&mut stream, &format!("k{index}"), -index, 0).unwrap(),
            0
        );
    }
    let expected: Vec<i64> = (0..300).filter(|index| index % 3 == 2).collect();
    assert_eq!(query_v(&mut stream, 0, 1000), expected);
    drop(stream);
    let log = node.terminate();
    assert_no_anomaly(&log);

    // The definition comes back from the work directory and the index is
    // rebuilt from the records, after a fast restart and a crash restart.
    for (run, how) in [(2, "fast restart"), (3, "crash restart")] {
        let node = Node::start(&config, &dir, port, run);
        let mut stream = connect(port);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !info(&mut stream, &["sindex/test/by_v"])[0]
            .1
            .contains("load_pct=100;")
        {
            assert!(
                Instant::now() < deadline,
                "the index was not rebuilt after a {how}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(query_v(&mut stream, 0, 1000), expected, "after a {how}");
        assert_eq!(query_v(&mut stream, -1000, -1).len(), 100, "after a {how}");
        let log = node.kill();
        assert!(log.contains("secondary index built"), "{log}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_lost_device_is_rebuilt_from_its_shadow_after_kill_9() {
    let dir = temp_dir("shadow");
    let config = write_config(&dir, "file = \"test.dat shadow/test-shadow.dat\"\nfilesize = \"4M\"\nwrite-block-size = \"64K\"\ncommit-to-device = true");
    let port = free_port();
    let node = Node::start(&config, &dir, port, 1);
    let mut stream = connect(port);
    for key in 0..300 {
        assert_eq!(put(&mut stream, &format!("s{key}"), key, 0).unwrap(), 0);
    }
    drop(stream);
    assert_no_anomaly(&node.kill());
    // The device is lost; its shadow (another directory, as another disk
    // would be) is left.
    std::fs::remove_file(dir.join("test.dat")).unwrap();
    let node = Node::start(&config, &dir, port, 2);
    let mut stream = connect(port);
    for key in 0..300 {
        assert_eq!(get(&mut stream, &format!("s{key}")), Some(key), "s{key}");
    }
    drop(stream);
    let log = node.kill();
    assert!(
        log.contains("rebuilt a blank device from its shadow"),
        "{log}"
    );
    assert_no_anomaly(&log);
    let _ = std::fs::remove_dir_all(&dir);
}
