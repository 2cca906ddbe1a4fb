//! Load through Citrine's own smart client (`citrine-client`, tokio) on a
//! cluster of real `citrined` processes (replication factor 2,
//! `examples/cluster.toml`) while a 4th node joins, a node is SIGKILLed
//! and then restarted empty, and a node is frozen (SIGSTOP) past the
//! heartbeat timeout and then let carry on (SIGCONT).
//!
//! Each client task owns its keys and writes known values (bin `v` = the
//! key's write count, so a write retried by the client is idempotent), and
//! reads its keys back expecting the last acknowledged value. Assertions:
//! no operation fails after the client's own retries (a generous total
//! timeout and retry count), every read sees the last acknowledged write,
//! every acknowledged write is readable afterwards with its value, and
//! after `cluster-stable` every partition's two replica holders have
//! identical copies (`partition-checksums`).
//!
//! The killed node is restarted only once the survivors have published a
//! view without it: a node that restarts empty within the heartbeat
//! timeout (1.5 s with `examples/cluster.toml`) never leaves the view, so
//! no migration refills it and its partitions read as empty (a known gap,
//! issue 5: partition versions). The survivors are also let finish their
//! migrations first, as in `tests/dupres.rs`: a node that returns while
//! its old holders still count it in their unfinished base is not sent its
//! partitions again (the partial-copy limitation of
//! `citrine_service::migration`).
//!
//! The frozen node wakes with the requests and heartbeats queued in its
//! sockets. It must notice that it stalled and give up its stale view
//! (`citrine_cluster::node`): when it instead timed its peers out and
//! formed a view of itself alone, the client read older values from it
//! for the seconds until the views merged (2 runs of 2 failed so).

#![allow(clippy::unwrap_used)]

mod common;

use citrine_client::{
    Bin, Bins, Client, ClientConfig, Key, Policy, ReadPolicy, Value, WritePolicy,
};
use common::cluster::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Client tasks.
const TASKS: usize = 6;
/// Keys per task.
const KEYS: usize = 24;

/// Generous retries: an operation fails only if the cluster cannot serve it
/// for 30 s.
fn policy() -> Policy {
    Policy {
        total_timeout: Duration::from_secs(30),
        socket_timeout: Duration::from_secs(4),
        max_retries: 1_000,
        backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(200),
        ..Policy::default()
    }
}

fn key(task: usize, index: usize) -> Key {
    Key::new("test", "load", format!("load-{task}-{index}"))
}

/// The value of bin `v` (0 when the record does not exist).
async fn read_value(client: &Client, key: &Key) -> Result<i64, String> {
    let policy = ReadPolicy {
        base: policy(),
        ..ReadPolicy::default()
    };
    match client.get(&policy, key, Bins::All).await {
        Ok(None) => Ok(0),
        Ok(Some(record)) => match record.bin("v") {
            Some(Value::Int(value)) => Ok(*value),
            other => Err(format!("{key:?}: bin v is {other:?}")),
        },
        Err(error) => Err(format!("{key:?}: read failed: {error}")),
    }
}

/// One task: 3 writes in 4 operations, each setting a key to its next
/// value; the rest read a key back. Returns the acknowledged values and the
/// failures.
async fn task(
    client: Client,
    task: usize,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
) -> (BTreeMap<usize, i64>, Vec<String>) {
    let write_policy = WritePolicy {
        base: policy(),
        ..WritePolicy::default()
    };
    let mut acked: BTreeMap<usize, i64> = (0..KEYS).map(|index| (index, 0)).collect();
    let mut errors = Vec::new();
    let mut step = 0usize;
    while !stop.load(Ordering::Relaxed) && errors.len() < 10 {
        step += 1;
        let index = (step * 7 + step / KEYS + task) % KEYS;
        let key = key(task, index);
        let expected = acked[&index];
        if step.is_multiple_of(4) {
            match read_value(&client, &key).await {
                Ok(value) if value == expected => {}
                Ok(value) => errors.push(format!("{key:?}: read {value}, expected {expected}")),
                Err(error) => errors.push(error),
            }
        } else {
            let next = expected + 1;
            let bins = [
                Bin::new("v", next),
                Bin::new("owner", format!("task-{task}")),
            ];
            match client.put(&write_policy, &key, &bins).await {
                Ok(()) => {
                    acked.insert(index, next);
                }
                Err(error) => errors.push(format!("{key:?}: write of {next} failed: {error}")),
            }
        }
        ops.fetch_add(1, Ordering::Relaxed);
    }
    (acked, errors)
}

/// Every node of `nodes` but the one at `skip`.
fn all_but(nodes: &[Node], skip: usize) -> Vec<&Node> {
    nodes
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != skip)
        .map(|(_, node)| node)
        .collect()
}

/// The load's phases: each runs the load for some seconds more and
/// records how many operations completed meanwhile (every phase must
/// make progress).
struct Phases<'a> {
    client: &'a Client,
    ops: &'a AtomicU64,
    started: Instant,
    done: Vec<(String, u64)>,
}

impl Phases<'_> {
    fn run(&mut self, what: &str, seconds: u64) {
        let before = self.ops.load(Ordering::Relaxed);
        let phase_started = Instant::now();
        std::thread::sleep(Duration::from_secs(seconds));
        let done = self.ops.load(Ordering::Relaxed) - before;
        let stats = self.client.stats();
        println!(
            "{:>5.1}s: {what}: {done} ops in {:?} (client: {} nodes, {} retries so far)",
            self.started.elapsed().as_secs_f64(),
            phase_started.elapsed(),
            stats.nodes,
            stats.retries
        );
        self.done.push((what.to_owned(), done));
    }

    /// Waits for all of `nodes` in one view, runs a second of load while
    /// they migrate, waits for `cluster-stable`, and runs a second more.
    fn settle(&mut self, nodes: &[Node], what: &str) {
        let group: Vec<&Node> = nodes.iter().collect();
        let took = wait_for_cluster(&group, group.len(), Duration::from_secs(20));
        println!("{what}: one view after {took:?}");
        self.run(&format!("{what}, migrating"), 1);
        let took = wait_for_stable(&group, Duration::from_secs(30));
        println!("{what}: stable after {took:?}");
        self.run(&format!("{what}, stable"), 1);
    }
}

#[test]
fn smart_client_load_survives_a_join_a_kill_and_an_empty_restart() {
    let started = Instant::now();
    let mut nodes = start_cluster(80);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let seeds: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port))
        .collect();
    let client = runtime
        .block_on(Client::connect(ClientConfig {
            tend_interval: Duration::from_millis(250),
            ..ClientConfig::new(seeds)
        }))
        .expect("client connects");
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|index| runtime.spawn(task(client.clone(), index, stop.clone(), ops.clone())))
        .collect();
    let mut load = Phases {
        client: &client,
        ops: &ops,
        started,
        done: Vec::new(),
    };
    load.run("3 nodes", 2);

    // (a) A 4th node joins.
    let seed = nodes[0].heartbeat_address();
    let mut fourth = Node::new(83);
    fourth.start(&seed);
    nodes.push(fourth);
    load.settle(&nodes, "4 nodes");

    // (b) SIGKILL one of the first three.
    nodes[1].kill();
    let killed = Instant::now();
    let survivors = all_but(&nodes, 1);
    // The departure must be noticed before the restart (see the module doc).
    let took = wait_for_cluster(&survivors, 3, Duration::from_secs(20));
    println!("survivors dropped the killed node after {took:?}");
    let took = wait_for_stable(&survivors, Duration::from_secs(30));
    println!("3 survivors stable after {took:?}");
    load.run("3 survivors", 1);

    // (c) It comes back empty (memory namespace: nothing survives a kill).
    let seed = nodes[0].heartbeat_address();
    nodes[1].start(&seed);
    println!(
        "killed node restarted {:?} after the kill",
        killed.elapsed()
    );
    load.settle(&nodes, "4 nodes again");

    // (d) One node freezes (SIGSTOP) past the heartbeat timeout, then
    // carries on (SIGCONT) with the requests queued in its sockets.
    nodes[2].freeze(true);
    let took = wait_for_cluster(&all_but(&nodes, 2), 3, Duration::from_secs(20));
    println!("the others dropped the frozen node after {took:?}");
    // Commands sent to the frozen node wait out the 4 s socket timeout (a
    // retry may go there once more, before the client has the new map).
    load.run("3 nodes, one frozen", 5);
    nodes[2].freeze(false);
    load.settle(&nodes, "4 nodes after the freeze");
    let phases = load.done;

    stop.store(true, Ordering::Relaxed);
    let mut acknowledged: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    let mut errors = Vec::new();
    for (index, handle) in tasks.into_iter().enumerate() {
        let (acked, failures) = runtime.block_on(handle).expect("task panicked");
        acknowledged.extend(acked.into_iter().map(|(key, value)| ((index, key), value)));
        errors.extend(failures);
    }
    let stats = client.stats();
    let writes: i64 = acknowledged.values().sum();
    println!(
        "{} ops ({writes} acknowledged writes) in {:?}; client: {} commands, {} retries, {} failures",
        ops.load(Ordering::Relaxed),
        started.elapsed(),
        stats.commands,
        stats.retries,
        stats.command_failures
    );
    assert!(errors.is_empty(), "failed operations: {errors:?}");
    assert_eq!(stats.command_failures, 0, "{stats:?}");
    for (what, done) in &phases {
        assert!(*done > 0, "no operation completed during {what:?}");
    }

    // Every acknowledged write is readable with its value.
    runtime.block_on(async {
        for ((task, index), value) in &acknowledged {
            let key = key(*task, *index);
            assert_eq!(read_value(&client, &key).await, Ok(*value), "{key:?}");
        }
    });
    client.close();

    // Every partition's replica holders have identical copies of it.
    let group: Vec<&Node> = nodes.iter().collect();
    wait_for_stable(&group, Duration::from_secs(30));
    let written = acknowledged.values().filter(|value| **value > 0).count() as u64;
    assert_eq!(
        copies_matching_the_map(&group),
        written,
        "records held by the replica lists"
    );
    println!("done in {:?}", started.elapsed());
}
