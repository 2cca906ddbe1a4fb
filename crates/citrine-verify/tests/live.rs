//! Each workload against a real single-node `citrined` for a couple of
//! seconds gets a valid verdict; the same runs' histories, deliberately
//! broken, are caught (stale read of a value never written, a lost
//! acknowledged increment, a lost acknowledged element); and a server that
//! acknowledges everything and keeps nothing (`citrined --noop`) is caught
//! by each workload for the reason that workload checks.
//!
//! `citrined` is found like the other crates' tests: `$CITRINED_BIN`, else
//! the newer of `<workspace>/target/{release,debug}/citrined`; missing is a
//! failure, not a skip.

use citrine_testsupport::{free_port, wait_until_serving};
use citrine_verify::history::{Event, EventKind};
use citrine_verify::linear::Limits;
use citrine_verify::workload::{self, Progress};
use citrine_verify::{
    check, AnomalyKind, Call, History, Outcome, Reply, Report, Status, Workload, WorkloadConfig,
};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh citrined on free ports, with `extra` command-line arguments.
fn citrined(extra: &[&str]) -> (Process, u16) {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let binary = match std::env::var("CITRINED_BIN") {
        Ok(path) if PathBuf::from(&path).is_file() => PathBuf::from(path),
        Ok(path) => workspace.join(path),
        Err(_) => ["release", "debug"]
            .iter()
            .map(|profile| workspace.join("target").join(profile).join("citrined"))
            .filter_map(|path| Some((std::fs::metadata(&path).ok()?.modified().ok()?, path)))
            .max_by_key(|(modified, _)| *modified)
            .map(|(_, path)| path)
            .unwrap_or_else(|| panic!("citrined not found: build it with `cargo build -p citrine-server` or set CITRINED_BIN")),
    };
    let port = free_port();
    let mut child = Command::new(binary)
        .args(["--port", &port.to_string(), "--address", "127.0.0.1"])
        .args(["--fabric-port", &free_port().to_string()])
        .args(["--heartbeat-port", &free_port().to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn citrined");
    wait_until_serving(&mut child, port, Duration::from_secs(15));
    (Process(child), port)
}

/// Runs `workload` for two seconds and checks it; returns the history too.
fn run(workload: Workload, port: u16) -> (History, Report) {
    run_for(workload, port, Duration::from_secs(2))
}

fn run_for(workload: Workload, port: u16, duration: Duration) -> (History, Report) {
    let mut config = WorkloadConfig::new(&format!("127.0.0.1:{port}"), "test", workload);
    config.set = format!("verify-{}", workload.name());
    config.duration = duration;
    config.clients = 8;
    config.keys = 4;
    config.ops_per_key = 100;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut progress = Vec::new();
    let history = runtime
        .block_on(workload::run(&config, |line: &Progress| {
            progress.push(*line)
        }))
        .expect("the workload runs");
    assert!(
        progress.len() >= 2,
        "a progress line each second: {progress:?}"
    );
    let report = check(workload, &history, &limits());
    (history, report)
}

fn limits() -> Limits {
    Limits {
        deadline: Instant::now() + Duration::from_secs(30),
        memory_bytes: 512 << 20,
    }
}

fn assert_valid(workload: Workload, history: &History, report: &Report) {
    let operations = history.operations().expect("well formed");
    let acknowledged = operations
        .iter()
        .filter(|operation| operation.is_ok())
        .count();
    assert!(
        acknowledged > 200,
        "{workload:?}: only {acknowledged} operations acknowledged"
    );
    assert_eq!(report.status, Status::Valid, "{workload:?}: {report:#?}");
}

/// The last acknowledged operation matching `pick`.
fn last_ok(history: &History, pick: impl Fn(&Call) -> bool) -> citrine_verify::history::Operation {
    let operations = history.operations().expect("well formed");
    operations
        .into_iter()
        .rev()
        .find(|operation| operation.is_ok() && pick(&operation.call))
        .expect("such an operation")
}

fn replace_reply(history: &mut History, position: usize, reply: Reply) {
    let Event { kind, .. } = &mut history.events[position];
    *kind = EventKind::Complete(Outcome::Ok(reply));
}

#[test]
fn register_run_is_linearizable_and_a_corrupted_read_is_caught() {
    let (_server, port) = citrined(&[]);
    let (mut history, report) = run(Workload::Register, port);
    assert_valid(Workload::Register, &history, &report);
    // Broken stream: one acknowledged read returns a value no client wrote
    // (the workload writes positive values only).
    let read = last_ok(&history, |call| *call == Call::Read);
    replace_reply(
        &mut history,
        read.complete.expect("completed"),
        Reply::Value(Some(-1)),
    );
    let broken = check(Workload::Register, &history, &limits());
    assert_eq!(broken.status, Status::Anomaly, "{broken:#?}");
    assert!(broken.has(AnomalyKind::NotLinearizable), "{broken:#?}");
    assert!(broken.anomalies[0]
        .witness
        .iter()
        .any(|line| line.contains("read ok -> -1")));
}

#[test]
fn counter_run_loses_nothing_and_a_lost_increment_is_caught() {
    let (_server, port) = citrined(&[]);
    let (mut history, report) = run(Workload::Counter, port);
    assert_valid(Workload::Counter, &history, &report);
    // Broken stream: the final read of a key misses one acknowledged
    // increment (it returns the acknowledged sum less one).
    let read = last_ok(&history, |call| *call == Call::Read);
    let acknowledged: i64 = history
        .operations()
        .expect("well formed")
        .iter()
        .filter(|operation| operation.key == read.key && operation.is_ok())
        .filter_map(|operation| match operation.call {
            Call::Add(delta) => Some(delta),
            _ => None,
        })
        .sum();
    assert!(acknowledged > 0);
    let position = read.complete.expect("completed");
    replace_reply(&mut history, position, Reply::Value(Some(acknowledged - 1)));
    let broken = check(Workload::Counter, &history, &limits());
    assert_eq!(broken.status, Status::Anomaly, "{broken:#?}");
    assert!(broken.has(AnomalyKind::LostIncrement), "{broken:#?}");
}

#[test]
fn set_run_keeps_every_element_and_a_lost_one_is_caught() {
    let (_server, port) = citrined(&[]);
    let (mut history, report) = run(Workload::Set, port);
    assert_valid(Workload::Set, &history, &report);
    // Broken stream: the final read of a key lacks one acknowledged element.
    let read = last_ok(&history, |call| *call == Call::ReadSet);
    let Some(Reply::Elements(mut elements)) = read.reply().cloned() else {
        panic!("the final read saw elements");
    };
    let operations = history.operations().expect("well formed");
    let acknowledged = operations
        .iter()
        .find_map(|operation| match operation.call {
            Call::Insert(element) if operation.key == read.key && operation.is_ok() => {
                Some(element)
            }
            _ => None,
        })
        .expect("an acknowledged element on that key");
    elements.retain(|element| *element != acknowledged);
    let position = read.complete.expect("completed");
    replace_reply(&mut history, position, Reply::Elements(elements));
    let broken = check(Workload::Set, &history, &limits());
    assert_eq!(broken.status, Status::Anomaly, "{broken:#?}");
    assert!(broken.has(AnomalyKind::LostElement), "{broken:#?}");
}

#[test]
fn a_server_that_acknowledges_and_forgets_is_caught_by_every_workload() {
    let (_server, port) = citrined(&["--noop"]);
    for (workload, kind) in [
        (Workload::Register, AnomalyKind::NotLinearizable),
        (Workload::Counter, AnomalyKind::LostIncrement),
        (Workload::Set, AnomalyKind::LostElement),
    ] {
        let (_, report) = run_for(workload, port, Duration::from_secs(1));
        assert_eq!(report.status, Status::Anomaly, "{workload:?}: {report:#?}");
        assert!(
            report.anomalies.iter().all(|anomaly| anomaly.kind == kind),
            "{workload:?}: {report:#?}"
        );
    }
}
