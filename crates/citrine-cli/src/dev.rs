//! `citrine dev`: a local cluster of real `citrined` processes in one command.
//!
//! Owns the whole life of the nodes it starts: it writes one configuration
//! (in-memory namespace `test`, replication factor min(2, N)), starts node
//! K on service port `--port + (K-1) * --port-step` (citrined derives the
//! fabric and heartbeat ports, +1 and +2; every node seeds from the others'
//! heartbeat ports), streams each node's output with a `[node K]` prefix,
//! waits until every node reports `cluster_size=N` under one cluster key,
//! prints how to connect, and stops the nodes on Ctrl-C, SIGTERM or SIGHUP.
//!
//! Invariant: no node outlives `citrine dev`. Every exit path stops them
//! (signal, a node dying, a start or cluster-formation failure, an error
//! return, a panic through `kill_on_drop`), and each node is made to die
//! with its parent (`PR_SET_PDEATHSIG`) in case `citrine dev` itself is
//! killed with SIGKILL. Nodes run in their own process group, so a
//! terminal's Ctrl-C reaches `citrine dev` alone and it stops them in order.

use crate::CliResult;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Largest cluster `citrine dev` starts (it is for one machine).
const MAX_NODES: u16 = 32;
/// How long a node has to stop after SIGTERM before it gets SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How often node exits and the cluster's formation are checked.
const POLL: Duration = Duration::from_millis(200);

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Node K (1..N) serves clients on PORT + (K-1) * STEP; its fabric and heartbeat \
                  ports are that +1 and +2.\nEvery node runs in memory: namespace `test`, replication \
                  factor min(2, N), cluster name `citrine-dev`.\nCtrl-C (or SIGTERM) stops every node; \
                  if one node dies, the others are stopped too and the exit status is 1.\n\n\
                  Examples:\n  citrine dev                          three nodes on 3000, 3100, 3200\n  \
                  citrine dev --nodes 5 --port 4000    five nodes on 4000..4400\n  \
                  citrine dev --data-dir /tmp/c        keep the nodes' files under /tmp/c\n\n\
                  Then, in another terminal:\n  citrine cluster -h 127.0.0.1:3000\n  \
                  citrine put -h 127.0.0.1:3000 -n test -s demo key1 a=1"
)]
pub struct DevArgs {
    /// How many nodes to start.
    #[arg(long = "nodes", default_value_t = 3, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=MAX_NODES as i64))]
    pub nodes: u16,
    /// Service port of node 1; node K uses PORT + (K-1) * STEP.
    #[arg(
        short = 'p',
        long = "port",
        default_value_t = 3000,
        value_name = "PORT"
    )]
    pub port: u16,
    /// Distance between two nodes' service ports (at least 3: each node
    /// also uses its port +1 for fabric and +2 for heartbeats).
    #[arg(long = "port-step", default_value_t = 100, value_name = "STEP",
          value_parser = clap::value_parser!(u16).range(3..))]
    pub port_step: u16,
    /// Keep the nodes' files (configuration, work directories) here instead
    /// of a temporary directory that is removed at exit.
    #[arg(long = "data-dir", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The `citrined` binary to run (default: $CITRINED, else the
    /// `citrined` next to `citrine`).
    #[arg(long = "citrined", value_name = "PATH")]
    pub citrined: Option<PathBuf>,
    /// Log level of the nodes: error, warn, info, debug or trace.
    #[arg(long = "log-level", default_value = "info", value_name = "LEVEL")]
    pub log_level: String,
    /// Seconds to wait for the nodes to form one cluster before giving up.
    #[arg(long = "wait", default_value_t = 60, value_name = "SECONDS")]
    pub wait_secs: u64,
}

/// One node to start: its number (1-based) and ports.
#[derive(Debug, Clone, PartialEq)]
struct NodePlan {
    number: u16,
    port: u16,
    heartbeat_port: u16,
}

/// A started node: its plan and its process.
struct Node {
    plan: NodePlan,
    child: Child,
    relays: Vec<tokio::task::JoinHandle<()>>,
}

/// Why `citrine dev` stops serving.
enum Ending {
    Signal(&'static str),
    NodeDied(u16, ExitStatus),
}

/// `citrine dev`: starts the nodes, serves until a stop signal or a node's
/// death, stops every node; exit status 0 after a signal, 1 otherwise.
pub async fn run(args: DevArgs) -> CliResult {
    // Before any node exists: from here on SIGTERM, SIGINT and SIGHUP are
    // ours to handle, never the default "die now and orphan the nodes".
    let mut signals = Signals::new()?;
    let plans = plan(args.nodes, args.port, args.port_step)?;
    let given = args
        .citrined
        .clone()
        .or_else(|| std::env::var_os("CITRINED").map(PathBuf::from));
    let binary = find_citrined(given.as_deref())?;
    let directory = DataDir::new(args.data_dir.clone())?;
    let config = write_config(directory.path(), args.nodes)?;
    let mut nodes = Vec::with_capacity(plans.len());
    for node_plan in &plans {
        match start_node(
            &binary,
            &config,
            directory.path(),
            node_plan,
            &plans,
            &args.log_level,
        ) {
            Ok(node) => nodes.push(node),
            Err(message) => {
                stop_all(&mut nodes).await;
                return Err(message);
            }
        }
    }
    let outcome = supervise(&mut nodes, &mut signals, &args, directory.path()).await;
    stop_all(&mut nodes).await;
    say(&format!("[dev] every node stopped; {}", directory.close()));
    match outcome {
        Ok(Ending::Signal(name)) => {
            say(&format!("[dev] stopped on {name}"));
            Ok(ExitCode::SUCCESS)
        }
        Ok(Ending::NodeDied(number, status)) => Err(format!(
            "node {number} died unexpectedly ({status}); stopped the other nodes (its last log lines are above)"
        )),
        Err(message) => Err(message),
    }
}

/// Waits for the cluster to form, tells how to connect, then serves until
/// a signal or a node's death. Signals and deaths are watched alongside
/// the info polling, never behind it: a node that accepts and never
/// answers cannot delay a stop.
async fn supervise(
    nodes: &mut [Node],
    signals: &mut Signals,
    args: &DevArgs,
    directory: &Path,
) -> Result<Ending, String> {
    let ports: Vec<u16> = nodes.iter().map(|node| node.plan.port).collect();
    let within = Duration::from_secs(args.wait_secs);
    tokio::select! {
        name = signals.next() => return Ok(Ending::Signal(name)),
        ending = first_death(nodes) => return Ok(ending),
        formed = tokio::time::timeout(within, cluster_formed(&ports)) => match formed {
            Ok(key) => announce(&ports, &key, directory),
            Err(_) => return Err(format!(
                "the {} nodes did not form one cluster within {} s (see their logs above); stopped them",
                ports.len(),
                args.wait_secs
            )),
        },
    }
    tokio::select! {
        name = signals.next() => Ok(Ending::Signal(name)),
        ending = first_death(nodes) => Ok(ending),
    }
}

/// Resolves when a node has exited, with which one and how.
async fn first_death(nodes: &mut [Node]) -> Ending {
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        if let Some(ending) = a_node_died(nodes) {
            return ending;
        }
    }
}

/// Resolves with the cluster key once the nodes on `ports` form one cluster.
async fn cluster_formed(ports: &[u16]) -> String {
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        if let Some(key) = formed_cluster(ports).await {
            return key;
        }
    }
}

/// The nodes' ports, checked to fit in 16 bits.
fn plan(nodes: u16, port: u16, step: u16) -> Result<Vec<NodePlan>, String> {
    (0..nodes)
        .map(|index| {
            let service = u32::from(port) + u32::from(index) * u32::from(step);
            let heartbeat = service + 2;
            if port == 0 || heartbeat > u32::from(u16::MAX) {
                return Err(format!(
                    "--port {port} with --nodes {nodes} and --port-step {step} needs ports up to {heartbeat}; choose a port between 1 and {}",
                    u32::from(u16::MAX).saturating_sub((u32::from(nodes) - 1) * u32::from(step) + 2)
                ));
            }
            Ok(NodePlan {
                number: index + 1,
                port: service as u16,
                heartbeat_port: heartbeat as u16,
            })
        })
        .collect()
}

/// `--citrined` / `$CITRINED`, else `citrined` next to this `citrine`.
fn find_citrined(given: Option<&Path>) -> Result<PathBuf, String> {
    let candidate = match given {
        Some(path) => path.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|error| {
                format!("cannot tell where `citrine` is ({error}); pass --citrined PATH")
            })?
            .with_file_name("citrined"),
    };
    if candidate.is_file() {
        return Ok(candidate);
    }
    let origin = if given.is_some() {
        "--citrined / $CITRINED"
    } else {
        "next to `citrine`"
    };
    Err(format!(
        "no citrined binary at {} ({origin})\n  hint: build it with `cargo build --release -p citrine-server`, or pass --citrined PATH (or set CITRINED=PATH)",
        candidate.display()
    ))
}

/// Where the nodes' files live; a temporary one is removed on drop.
struct DataDir {
    path: PathBuf,
    temporary: bool,
}

impl DataDir {
    fn new(given: Option<PathBuf>) -> Result<DataDir, String> {
        let (path, temporary) = match given {
            Some(path) => (path, false),
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|elapsed| elapsed.subsec_nanos())
                    .unwrap_or(0);
                let name = format!("citrine-dev-{}-{nanos:x}", std::process::id());
                (std::env::temp_dir().join(name), true)
            }
        };
        std::fs::create_dir_all(&path).map_err(|error| {
            format!(
                "cannot create the data directory {}: {error}",
                path.display()
            )
        })?;
        Ok(DataDir { path, temporary })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// Removes a temporary directory now and says what became of the files.
    fn close(self) -> String {
        if !self.temporary {
            return format!("their files stay in {}", self.path.display());
        }
        match std::fs::remove_dir_all(&self.path) {
            Ok(()) => format!("removed {}", self.path.display()),
            Err(error) => format!("could not remove {}: {error}", self.path.display()),
        }
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if self.temporary && self.path.exists() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The one configuration every node reads; ports, seeds and work
/// directories come on each node's command line.
fn config_text(nodes: u16) -> String {
    let replication_factor = nodes.min(2);
    format!(
        "# Written by `citrine dev` for a local cluster of {nodes} node(s).\n\
         [service]\naddress = \"127.0.0.1\"\ncluster-name = \"citrine-dev\"\n\n\
         [heartbeat]\ninterval = 150\ntimeout = 10\n\n\
         [[namespace]]\nname = \"test\"\nreplication-factor = {replication_factor}\n\n\
         [namespace.storage-engine]\ntype = \"memory\"\ndata-size = \"512M\"\n"
    )
}

fn write_config(directory: &Path, nodes: u16) -> Result<PathBuf, String> {
    let path = directory.join("citrine-dev.toml");
    std::fs::write(&path, config_text(nodes))
        .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    Ok(path)
}

/// Starts one node with its output piped into `[node K]` lines. Must run
/// on the thread that stays alive as long as `citrine dev` (the main
/// thread, inside `block_on`): the death signal follows the forking thread.
fn start_node(
    binary: &Path,
    config: &Path,
    directory: &Path,
    node: &NodePlan,
    all: &[NodePlan],
    log_level: &str,
) -> Result<Node, String> {
    let mut command = Command::new(binary);
    command
        .arg("--config")
        .arg(config)
        .args(["--port", &node.port.to_string(), "--log-level", log_level])
        .arg("--data-dir")
        .arg(directory.join(format!("node-{}", node.number)))
        .args(seeds_of(node, all))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    die_with_parent(&mut command);
    let mut child = command.spawn().map_err(|error| {
        format!(
            "cannot start {} for node {}: {error}",
            binary.display(),
            node.number
        )
    })?;
    let prefix = format!("[node {}] ", node.number);
    let mut relays = Vec::with_capacity(2);
    if let Some(stdout) = child.stdout.take() {
        relays.push(tokio::spawn(relay(prefix.clone(), stdout)));
    }
    if let Some(stderr) = child.stderr.take() {
        relays.push(tokio::spawn(relay(prefix, stderr)));
    }
    say(&format!(
        "[dev] node {}: pid {}, service port {} (fabric {}, heartbeat {})",
        node.number,
        child.id().unwrap_or(0),
        node.port,
        node.port + 1,
        node.heartbeat_port
    ));
    Ok(Node {
        plan: node.clone(),
        child,
        relays,
    })
}

/// `--seed` arguments: every other node's heartbeat address.
fn seeds_of(node: &NodePlan, all: &[NodePlan]) -> Vec<String> {
    all.iter()
        .filter(|other| other.number != node.number)
        .flat_map(|other| {
            [
                "--seed".to_string(),
                format!("127.0.0.1:{}", other.heartbeat_port),
            ]
        })
        .collect()
}

/// Asks the kernel to SIGKILL the node when `citrine dev` dies, so even a
/// SIGKILL of `citrine dev` leaves no node behind.
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only async-signal-safe functions (prctl, getppid); it allocates
    // nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before prctl took effect: do not start at all.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Copies a node's output to ours, one prefixed line at a time.
async fn relay(prefix: String, stream: impl AsyncRead + Unpin) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        say(&format!("{prefix}{line}"));
    }
}

/// Prints a line; a closed stdout is ignored (the nodes must still be
/// stopped, so this never exits the process).
fn say(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// The first node found exited, if any.
fn a_node_died(nodes: &mut [Node]) -> Option<Ending> {
    nodes
        .iter_mut()
        .find_map(|node| match node.child.try_wait() {
            Ok(Some(status)) => Some(Ending::NodeDied(node.plan.number, status)),
            _ => None,
        })
}

/// The cluster key when every node answers `cluster_size=N` with the same
/// non-zero key.
async fn formed_cluster(ports: &[u16]) -> Option<String> {
    const ASK: Duration = Duration::from_secs(1);
    let mut keys = Vec::with_capacity(ports.len());
    for port in ports {
        let host = format!("127.0.0.1:{port}");
        let asked = citrine_client::info_at(&host, &["statistics"], ASK);
        let answer = tokio::time::timeout(ASK, asked).await.ok()?.ok()?;
        let statistics = crate::info_cmd::parse_kv(&answer.first()?.1);
        let size: usize = statistics.get("cluster_size")?.parse().ok()?;
        let key = statistics.get("cluster_key")?.clone();
        if size != ports.len() || key.is_empty() || key == "0" {
            return None;
        }
        keys.push(key);
    }
    let first = keys.first()?.clone();
    keys.iter().all(|key| *key == first).then_some(first)
}

/// Tells how to reach the cluster once it has formed.
fn announce(ports: &[u16], key: &str, directory: &Path) {
    let first = ports.first().copied().unwrap_or(3000);
    let seeds: Vec<String> = ports
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    let replication_factor = ports.len().min(2);
    say(&format!(
        "[dev] ready: {n} node(s) in one cluster (cluster_size={n}, cluster_key={key}), namespace `test` in memory, replication factor {replication_factor}\n\
         [dev]   citrine cluster -h 127.0.0.1:{first}      the node table\n\
         [dev]   citrine info -h 127.0.0.1:{first}         one node's summary\n\
         [dev]   clients: seed 127.0.0.1:{first} (any of {all} works), cluster name citrine-dev\n\
         [dev]   files under {dir}\n\
         [dev] Ctrl-C stops every node.",
        n = ports.len(),
        all = seeds.join(", "),
        dir = directory.display()
    ));
}

/// SIGTERM to every node still running, then SIGKILL to any that has not
/// stopped within [`STOP_GRACE`]; every node is reaped before it returns.
async fn stop_all(nodes: &mut [Node]) {
    for node in nodes.iter_mut() {
        if let Some(pid) = node.child.id() {
            terminate(pid);
        }
    }
    // One grace period for all of them: they were all told at once.
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    for node in nodes.iter_mut() {
        match tokio::time::timeout_at(deadline, node.child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                say(&format!(
                    "[dev] node {} did not stop within {} s; killing it",
                    node.plan.number,
                    STOP_GRACE.as_secs()
                ));
                let _ = node.child.kill().await;
            }
        }
    }
    // A stopped node's last lines (why it died, its shutdown) come first.
    for node in nodes.iter_mut() {
        for relay in node.relays.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(2), relay).await;
        }
    }
}

/// SIGTERM to a child not yet reaped (so `pid` is still ours).
#[allow(unsafe_code)]
fn terminate(pid: u32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
}

/// The stop signals `citrine dev` answers by stopping its nodes.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    fn new() -> Result<Signals, String> {
        let listen = |kind: SignalKind| {
            signal(kind).map_err(|error| format!("cannot listen for signals: {error}"))
        };
        Ok(Signals {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
            hangup: listen(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_step_from_the_first() {
        let plans = plan(3, 3000, 100).expect("fits");
        let ports: Vec<(u16, u16, u16)> = plans
            .iter()
            .map(|p| (p.number, p.port, p.heartbeat_port))
            .collect();
        assert_eq!(
            ports,
            vec![(1, 3000, 3002), (2, 3100, 3102), (3, 3200, 3202)]
        );
        let seeds = seeds_of(&plans[0], &plans);
        assert_eq!(
            seeds,
            ["--seed", "127.0.0.1:3102", "--seed", "127.0.0.1:3202"]
        );
    }

    #[test]
    fn ports_past_65535_are_refused() {
        let error = plan(3, 65400, 100).expect_err("does not fit");
        assert!(error.contains("65602"), "{error}");
        assert!(plan(1, 65533, 100).is_ok());
        assert!(plan(1, 0, 100).is_err());
    }

    #[test]
    fn replication_factor_is_at_most_two() {
        assert!(config_text(1).contains("replication-factor = 1\n"));
        assert!(config_text(2).contains("replication-factor = 2\n"));
        assert!(config_text(5).contains("replication-factor = 2\n"));
    }
}
