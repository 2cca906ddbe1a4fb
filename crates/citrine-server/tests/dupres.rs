//! Duplicate resolution under continuous load (real `citrined` processes,
//! replication factor 2, `examples/cluster.toml`): client threads increment
//! counters and read them back while a 4th node joins, a node is SIGKILLed
//! and then restarted empty. Each counter is owned by one thread, so the
//! thread knows its exact value: every read must return it (a new master
//! that missed a record not migrated yet would answer "not found" or an
//! older value), and the final value of every counter must equal its
//! acknowledged increments (a write at a new master starting from an empty
//! record would lose them). An increment whose outcome is in doubt (9, a
//! dropped connection) is settled by reading the counter back. After
//! `cluster-stable`, every partition's two replica holders agree.

#![allow(clippy::unwrap_used)]

mod common;

use citrine_wire::msg::{info1, info2, op_type, MsgHeader};
use common::cluster::*;
use common::*;
use std::collections::BTreeMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Client threads.
const THREADS: usize = 4;
/// Counters per thread.
const COUNTERS: usize = 16;
/// How long one operation may keep retrying.
const RETRY_BUDGET: Duration = Duration::from_secs(20);

/// How one attempt ended.
enum Outcome {
    Done(u8, Option<i64>),
    /// No reply (connection error): in doubt for a write.
    Lost,
}

fn attempt(port: u16, frame: &[u8]) -> Outcome {
    let Ok(address) = format!("127.0.0.1:{port}").parse() else {
        return Outcome::Lost;
    };
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_millis(300)) else {
        return Outcome::Lost;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(8)));
    let _ = stream.set_nodelay(true);
    match round_trip(&mut stream, frame) {
        Ok((_, body)) => {
            let (header, bins) = decode_reply(&body);
            let value = bins
                .into_iter()
                .find(|(name, _, _)| name == b"c")
                .and_then(|(_, _, value)| value.try_into().ok())
                .map(i64::from_be_bytes);
            Outcome::Done(header.result_code, value)
        }
        Err(_) => Outcome::Lost,
    }
}

fn incr_frame(key: &str) -> Vec<u8> {
    record_request(
        "test",
        key,
        MsgHeader {
            info1: info1::READ,
            info2: info2::WRITE,
            transaction_ttl: 3000,
            ..MsgHeader::default()
        },
        &[
            (op_type::INCR, 1, "c", 1i64.to_be_bytes().to_vec()),
            (op_type::READ, 0, "c", Vec::new()),
        ],
    )
}

fn read_frame_for(key: &str) -> Vec<u8> {
    record_request(
        "test",
        key,
        MsgHeader {
            info1: info1::READ | info1::GET_ALL,
            transaction_ttl: 3000,
            ..MsgHeader::default()
        },
        &[],
    )
}

/// The live nodes' client ports, shared with the client threads.
type Ports = Arc<Mutex<Vec<u16>>>;

fn pick(ports: &Ports, turn: &mut usize) -> u16 {
    let ports = ports.lock().unwrap();
    *turn += 1;
    ports[*turn % ports.len()]
}

/// Reads a counter until a definite answer: its value (0 when absent).
fn read_value(ports: &Ports, turn: &mut usize, key: &str) -> Result<i64, String> {
    let started = Instant::now();
    let frame = read_frame_for(key);
    while started.elapsed() < RETRY_BUDGET {
        match attempt(pick(ports, turn), &frame) {
            Outcome::Done(0, Some(value)) => return Ok(value),
            Outcome::Done(2, _) => return Ok(0),
            Outcome::Done(0, None) => return Err(format!("{key}: read without bin")),
            Outcome::Done(code, _) if code != 9 && code != 11 => {
                return Err(format!("{key}: read answered {code}"))
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    Err(format!("{key}: no read answer within {RETRY_BUDGET:?}"))
}

/// Increments a counter whose exact value is `expected`; returns the new
/// value once the increment is known to have happened.
fn increment(ports: &Ports, turn: &mut usize, key: &str, expected: i64) -> Result<i64, String> {
    let started = Instant::now();
    let frame = incr_frame(key);
    while started.elapsed() < RETRY_BUDGET {
        match attempt(pick(ports, turn), &frame) {
            Outcome::Done(0, Some(value)) if value == expected + 1 => return Ok(value),
            Outcome::Done(0, value) => {
                return Err(format!("{key}: increment of {expected} gave {value:?}"))
            }
            // Refused before executing (partition unavailable).
            Outcome::Done(11, _) => std::thread::sleep(Duration::from_millis(20)),
            // In doubt: settle by reading.
            Outcome::Done(9, _) | Outcome::Lost => {
                let value = read_value(ports, turn, key)?;
                if value == expected + 1 {
                    return Ok(value);
                }
                if value != expected {
                    return Err(format!(
                        "{key}: expected {expected} after a doubt, read {value}"
                    ));
                }
            }
            Outcome::Done(code, _) => return Err(format!("{key}: increment answered {code}")),
        }
    }
    Err(format!("{key}: increment not done within {RETRY_BUDGET:?}"))
}

/// One client thread: increments (3 in 4) and reads its own counters.
fn client(
    thread: usize,
    ports: Ports,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
) -> (BTreeMap<String, i64>, Vec<String>) {
    let keys: Vec<String> = (0..COUNTERS)
        .map(|index| format!("counter-{thread}-{index}"))
        .collect();
    let mut values: BTreeMap<String, i64> = keys.iter().map(|key| (key.clone(), 0)).collect();
    let mut errors = Vec::new();
    let mut turn = thread;
    let mut step = 0usize;
    while !stop.load(Ordering::Relaxed) && errors.len() < 10 {
        step += 1;
        let key = &keys[(step * 7 + step / 16 + thread) % keys.len()];
        let expected = values[key];
        if step.is_multiple_of(4) {
            match read_value(&ports, &mut turn, key) {
                Ok(value) if value == expected => {}
                Ok(value) => errors.push(format!("{key}: read {value}, expected {expected}")),
                Err(error) => errors.push(error),
            }
        } else {
            match increment(&ports, &mut turn, key, expected) {
                Ok(value) => {
                    values.insert(key.clone(), value);
                }
                Err(error) => errors.push(error),
            }
        }
        ops.fetch_add(1, Ordering::Relaxed);
    }
    (values, errors)
}

#[test]
fn no_update_is_lost_while_nodes_join_die_and_return() {
    let started = Instant::now();
    let mut nodes = start_cluster(60);
    let ports: Ports = Arc::new(Mutex::new(nodes.iter().map(|node| node.port).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (ports, stop, ops) = (ports.clone(), stop.clone(), ops.clone());
            std::thread::spawn(move || client(thread, ports, stop, ops))
        })
        .collect();
    let pause = |seconds: u64| {
        let before = ops.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(seconds));
        println!(
            "{:>5.1}s: {} ops in {seconds}s",
            started.elapsed().as_secs_f64(),
            ops.load(Ordering::Relaxed) - before
        );
    };
    pause(2);
    // (a) A 4th node joins.
    let seed = nodes[0].heartbeat_address();
    let mut fourth = Node::new(63);
    fourth.start(&seed);
    nodes.push(fourth);
    // Clients learn of a node once it is in the cluster (a node alone
    // serves its own single-node view, like a smart client's peers list).
    wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        4,
        Duration::from_secs(20),
    );
    ports.lock().unwrap().push(nodes[3].port);
    pause(2);
    let took = wait_for_stable(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(30));
    println!("4 nodes stable after {took:?}");
    pause(1);
    // (b) SIGKILL one of the first three.
    let victim = nodes[1].port;
    ports.lock().unwrap().retain(|port| *port != victim);
    nodes[1].kill();
    let survivors: Vec<&Node> = nodes
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != 1)
        .map(|(_, node)| node)
        .collect();
    wait_for_cluster(&survivors, 3, Duration::from_secs(20));
    pause(1);
    // The survivors finish their migrations first: a node that returns
    // while its old holders still count it in their base is not sent its
    // partitions again (the documented partial-copy limitation of
    // `citrine_service::migration`, which partition versions will lift).
    let took = wait_for_stable(&survivors, Duration::from_secs(30));
    println!("3 survivors stable after {took:?}");
    // (c) It comes back empty.
    let seed = nodes[0].heartbeat_address();
    nodes[1].start(&seed);
    wait_for_cluster(
        &nodes.iter().collect::<Vec<_>>(),
        4,
        Duration::from_secs(20),
    );
    ports.lock().unwrap().push(nodes[1].port);
    pause(2);
    let took = wait_for_stable(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(30));
    println!("4 nodes stable again after {took:?}");
    pause(1);
    stop.store(true, Ordering::Relaxed);
    let mut expected = BTreeMap::new();
    let mut errors = Vec::new();
    for handle in clients {
        let (values, failures) = handle.join().unwrap();
        expected.extend(values);
        errors.extend(failures);
    }
    assert!(errors.is_empty(), "failed operations: {errors:?}");
    let increments: i64 = expected.values().sum();
    println!(
        "{} ops, {increments} acknowledged increments, in {:?}",
        ops.load(Ordering::Relaxed),
        started.elapsed()
    );
    // Every acknowledged increment is there, read through every node.
    for node in &nodes {
        let ports: Ports = Arc::new(Mutex::new(vec![node.port]));
        let mut turn = 0;
        for (key, value) in &expected {
            assert_eq!(
                read_value(&ports, &mut turn, key),
                Ok(*value),
                "{key} through node {}",
                node.id
            );
        }
    }
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_stable(&group, Duration::from_secs(30));
    assert_eq!(
        copies_matching_the_map(&group),
        (THREADS * COUNTERS) as u64,
        "records held by the replica lists"
    );
}
