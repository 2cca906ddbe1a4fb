//! End-to-end tests of `citrine dev`: it starts real `citrined` processes
//! (found like the other CLI tests: `$CITRINED_BIN`, else the newer of
//! `<workspace>/target/{release,debug}/citrined`), they form one cluster
//! that serves records, and no node it started outlives it: not after
//! SIGTERM, not after one node dies.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const CITRINE: &str = env!("CARGO_BIN_EXE_citrine");

fn citrined_binary() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    match std::env::var("CITRINED_BIN") {
        Ok(path) if PathBuf::from(&path).is_file() => PathBuf::from(path),
        Ok(path) => workspace.join(path),
        Err(_) => ["release", "debug"]
            .iter()
            .map(|profile| workspace.join("target").join(profile).join("citrined"))
            .filter_map(|path| Some((std::fs::metadata(&path).ok()?.modified().ok()?, path)))
            .max_by_key(|(modified, _)| *modified)
            .map(|(_, path)| path)
            .unwrap_or_else(|| panic!("citrined not found: build it with `cargo build -p citrine-server` or set CITRINED_BIN")),
    }
}

/// A running `citrine dev`, its output lines, and the node pids it printed.
/// Dropping it stops it (SIGTERM, then SIGKILL) so a failed test leaves
/// nothing running either.
struct Dev {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Dev {
    fn start(args: &[&str]) -> Dev {
        let mut child = Command::new(CITRINE)
            .arg("dev")
            .args(args)
            .arg("--citrined")
            .arg(citrined_binary())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn citrine dev");
        let (sender, lines) = channel();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let sender = sender.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if sender.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Dev {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one starts with `prefix`; panics with everything
    /// seen if none comes within `within`.
    fn wait_for(&mut self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "no line starting with {prefix:?} within {within:?}; output:\n{}",
            self.seen.join("\n")
        );
    }

    /// The node pids of the `[dev] node K: pid P, ...` lines seen so far.
    fn node_pids(&self) -> Vec<u32> {
        self.seen
            .iter()
            .filter_map(|line| {
                line.strip_prefix("[dev] node ")?
                    .split_once(": pid ")?
                    .1
                    .split(',')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect()
    }

    fn signal(&self, name: &str) {
        send_signal(self.child.id(), name);
    }

    /// Waits for `citrine dev` to exit; the rest of its output goes to `seen`.
    fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(500)) {
                    self.seen.push(line);
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "citrine dev still running after {within:?}; output:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            send_signal(self.child.id(), "TERM");
            std::thread::sleep(Duration::from_secs(3));
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn send_signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// Whether a `citrined` with this pid still exists (a zombie counts: it
/// would mean nobody reaped it).
fn citrined_alive(pid: u32) -> bool {
    let proc = Path::new("/proc").join(pid.to_string());
    std::fs::read(proc.join("cmdline"))
        .map(|cmdline| String::from_utf8_lossy(&cmdline).contains("citrined"))
        .unwrap_or(false)
}

fn citrine(args: &[&str]) -> Output {
    Command::new(CITRINE)
        .args(args)
        .output()
        .expect("run citrine")
}

fn info_value(port: u16, command: &str) -> String {
    let output = citrine(&["info", "-h", &format!("127.0.0.1:{port}"), "-v", command]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn stat(answer: &str, name: &str) -> Option<u64> {
    answer
        .split(';')
        .find_map(|item| item.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
}

#[test]
fn dev_serves_a_three_node_cluster_and_leaves_no_node_after_sigterm() {
    let ports = [3970u16, 3980, 3990];
    let mut dev = Dev::start(&["--nodes", "3", "--port", "3970", "--port-step", "10"]);
    dev.wait_for("[dev] ready", Duration::from_secs(25));
    let pids = dev.node_pids();
    assert_eq!(pids.len(), 3, "{}", dev.seen.join("\n"));
    assert!(pids.iter().all(|pid| citrined_alive(*pid)));
    for port in ports {
        let statistics = info_value(port, "statistics");
        assert_eq!(
            stat(&statistics, "cluster_size"),
            Some(3),
            "node {port}: {statistics}"
        );
    }
    assert!(info_value(3970, "namespaces")
        .split(';')
        .any(|ns| ns == "test"));

    let put = citrine(&[
        "put",
        "-h",
        "127.0.0.1:3970",
        "-n",
        "test",
        "-s",
        "dev",
        "k1",
        "a=7",
    ]);
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let get = citrine(&[
        "get",
        "-h",
        "127.0.0.1:3990",
        "-n",
        "test",
        "-s",
        "dev",
        "k1",
        "--output-json",
    ]);
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    let record: serde_json::Value = serde_json::from_slice(&get.stdout).expect("json record");
    assert_eq!(record["bins"]["a"], 7);
    // Replication factor 2: the record is on exactly two of the three nodes.
    let copies = |ports: &[u16]| -> u64 {
        ports
            .iter()
            .map(|port| stat(&info_value(*port, "namespace/test"), "objects").unwrap_or(0))
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while copies(&ports) != 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(copies(&ports), 2);

    dev.signal("TERM");
    let status = dev.wait_exit(Duration::from_secs(20));
    assert!(
        status.success(),
        "{status}; output:\n{}",
        dev.seen.join("\n")
    );
    let alive: Vec<u32> = pids
        .into_iter()
        .filter(|pid| citrined_alive(*pid))
        .collect();
    assert!(
        alive.is_empty(),
        "citrined still running after citrine dev exited: {alive:?}"
    );
    assert!(dev
        .seen
        .iter()
        .any(|line| line == "[dev] stopped on SIGTERM"));
    let files = dev
        .seen
        .iter()
        .find_map(|line| line.strip_prefix("[dev]   files under "))
        .expect("the data directory is named");
    assert!(
        !Path::new(files).exists(),
        "the temporary {files} was not removed"
    );
}

#[test]
fn a_node_that_dies_stops_the_others_and_fails() {
    let mut dev = Dev::start(&["--nodes", "2", "--port", "4600", "--port-step", "10"]);
    dev.wait_for("[dev] ready", Duration::from_secs(25));
    let pids = dev.node_pids();
    assert_eq!(pids.len(), 2, "{}", dev.seen.join("\n"));
    send_signal(pids[1], "KILL");
    let status = dev.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "output:\n{}", dev.seen.join("\n"));
    assert!(
        dev.seen
            .iter()
            .any(|line| line.contains("node 2 died unexpectedly")),
        "output:\n{}",
        dev.seen.join("\n")
    );
    assert!(!citrined_alive(pids[0]), "node 1 outlived citrine dev");
}

#[test]
fn a_missing_citrined_is_named() {
    let output = citrine(&[
        "dev",
        "--nodes",
        "1",
        "--port",
        "4610",
        "--citrined",
        "/nonexistent/citrined",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no citrined binary at /nonexistent/citrined"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cargo build --release -p citrine-server"),
        "{stderr}"
    );
}

#[test]
fn a_sigkill_of_citrine_dev_takes_its_nodes_with_it() {
    let mut dev = Dev::start(&["--nodes", "2", "--port", "4650", "--port-step", "10"]);
    dev.wait_for("[dev] ready", Duration::from_secs(25));
    let pids = dev.node_pids();
    assert_eq!(pids.len(), 2, "{}", dev.seen.join("\n"));
    dev.signal("KILL");
    dev.wait_exit(Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|pid| citrined_alive(*pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let alive: Vec<u32> = pids
        .into_iter()
        .filter(|pid| citrined_alive(*pid))
        .collect();
    // Nothing removes the temporary directory of a SIGKILLed `citrine dev`.
    let files = dev
        .seen
        .iter()
        .find_map(|line| line.strip_prefix("[dev]   files under "));
    if let Some(directory) = files {
        let _ = std::fs::remove_dir_all(directory);
    }
    assert!(
        alive.is_empty(),
        "citrined outlived a SIGKILLed citrine dev: {alive:?}"
    );
}

#[test]
fn a_node_that_cannot_start_stops_the_others_and_fails() {
    // Node 2's service port is taken, so it exits before any cluster forms.
    let _taken = std::net::TcpListener::bind("127.0.0.1:4690").expect("bind 4690");
    let mut dev = Dev::start(&["--nodes", "2", "--port", "4680", "--port-step", "10"]);
    let status = dev.wait_exit(Duration::from_secs(20));
    let output = dev.seen.join("\n");
    assert_eq!(status.code(), Some(1), "output:\n{output}");
    assert!(output.contains("node 2 died unexpectedly"), "{output}");
    assert!(
        output.contains("[node 2] citrined: cannot listen on 127.0.0.1:4690"),
        "{output}"
    );
    assert!(
        !citrined_alive(dev.node_pids()[0]),
        "node 1 outlived citrine dev"
    );
}

#[test]
fn a_sigterm_before_the_cluster_forms_stops_every_node() {
    let mut dev = Dev::start(&["--nodes", "2", "--port", "4620", "--port-step", "10"]);
    dev.wait_for("[dev] node 2: pid", Duration::from_secs(10));
    let pids = dev.node_pids();
    dev.signal("TERM");
    let status = dev.wait_exit(Duration::from_secs(20));
    let output = dev.seen.join("\n");
    assert!(status.success(), "{status}; output:\n{output}");
    assert!(!output.contains("[dev] ready"), "{output}");
    assert!(output.contains("[dev] stopped on SIGTERM"), "{output}");
    let alive: Vec<u32> = pids
        .into_iter()
        .filter(|pid| citrined_alive(*pid))
        .collect();
    assert!(alive.is_empty(), "citrined still running: {alive:?}");
}

/// Whether any process (not a zombie) has this pid.
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
            state != Some(Some('Z'))
        })
        .unwrap_or(false)
}

#[test]
fn nodes_that_ignore_sigterm_are_killed_after_one_grace_period() {
    // Stand-ins for hung nodes: they ignore SIGTERM and never serve.
    let directory = std::env::temp_dir().join(format!("citrine-dev-test-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("temp dir");
    let stubborn = directory.join("stubborn-node");
    std::fs::write(&stubborn, "#!/bin/sh\ntrap '' TERM\nexec sleep 60\n").expect("write script");
    let made_executable = Command::new("chmod").arg("+x").arg(&stubborn).status();
    assert!(made_executable.expect("chmod").success());
    let mut child = Command::new(CITRINE)
        .args([
            "dev",
            "--nodes",
            "2",
            "--port",
            "4640",
            "--port-step",
            "10",
            "--citrined",
        ])
        .arg(&stubborn)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn citrine dev");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let pids: Vec<u32> = (0..2)
        .map(|_| {
            let started = lines.next().and_then(Result::ok).unwrap_or_default();
            started
                .split_once(": pid ")
                .and_then(|(_, rest)| rest.split(',').next()?.parse().ok())
                .unwrap_or_else(|| panic!("no pid in {started:?}"))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    send_signal(child.id(), "TERM");
    let began = Instant::now();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("wait");
    let took = began.elapsed();
    let _ = std::fs::remove_dir_all(&directory);
    assert!(status.success(), "{status}: {rest:?}");
    // Both were told at once, so both are killed after one 10 s grace
    // period, not one after the other.
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(15),
        "{took:?}"
    );
    for number in [1, 2] {
        let killed = format!("node {number} did not stop within 10 s; killing it");
        assert!(rest.iter().any(|line| line.contains(&killed)), "{rest:?}");
    }
    let alive: Vec<u32> = pids.into_iter().filter(|pid| process_alive(*pid)).collect();
    assert!(
        alive.is_empty(),
        "stubborn nodes outlived citrine dev: {alive:?}"
    );
}
