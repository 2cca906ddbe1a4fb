//! The workloads: concurrent clients running Jepsen's Aerospike operations
//! against a live cluster for a given time, recording every operation.
//!
//! Owns [`Workload`], [`WorkloadConfig`], [`run`] and the mapping of a
//! client's answer onto an [`Outcome`]: an answer is ok; a definite result
//! code (generation mismatch 3, unavailable 11, key busy 14, ...) is a
//! failure; a timeout (client side or the server's 9), a broken or refused
//! connection, an undecodable answer, or any error the client flags in
//! doubt leaves the operation in doubt. Writes are sent once (no client
//! retries), so an operation is one attempt and its outcome is exact.
//!
//! Each client is its own [`Client`] (its own cluster view and
//! connections), a process in the history. Keys are fresh for each run (a
//! set named after the run), so registers start absent and counters at 0.
//! Register and set keys are used for `ops_per_key` operations each and
//! then replaced by a new key, as Jepsen's independent keys are: this keeps
//! each key's history small enough for the linearizability search. The
//! counter and set workloads end with a final read of every key, after
//! every client stopped. Register and set values are unique in a run.

use crate::history::{Call, History, Outcome, Recorder, Reply};
use citrine_client::{
    cdt, Bin, Bins, Client, ClientConfig, Element, Error, GenerationPolicy, Key, ReadModeSc,
    ReadPolicy, Value, WritePolicy,
};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which workload to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Reads, writes and generation-checked compare-and-sets of one integer bin.
    Register,
    /// Increments of one integer bin, and reads.
    Counter,
    /// Appends of unique integers to a list bin, and a final read.
    Set,
}

impl Workload {
    /// The workload's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Register => "register",
            Workload::Counter => "counter",
            Workload::Set => "set",
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = String;

    fn from_str(text: &str) -> Result<Workload, String> {
        match text {
            "register" => Ok(Workload::Register),
            "counter" => Ok(Workload::Counter),
            "set" => Ok(Workload::Set),
            other => Err(format!(
                "unknown workload {other:?}: use register, counter or set"
            )),
        }
    }
}

/// The bin a register or counter lives in.
pub const VALUE_BIN: &str = "value";
/// The list bin of the set workload.
pub const SET_BIN: &str = "elements";

/// How to run a workload.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Seed hosts (`host:port`).
    pub hosts: Vec<String>,
    pub namespace: String,
    /// Set the records go in; use a fresh name per run.
    pub set: String,
    pub workload: Workload,
    /// How long the clients run.
    pub duration: Duration,
    /// Concurrent clients.
    pub clients: usize,
    /// Keys in use at any time (clients are spread over them).
    pub keys: usize,
    /// Register and set: operations on one key before it is replaced.
    pub ops_per_key: u64,
    /// Deadline of one operation.
    pub timeout: Duration,
    /// Seed of the clients' random choices.
    pub seed: u64,
    /// Reads of a strong-consistency namespace (linearizable by default:
    /// the register's check is linearizability).
    pub read_mode_sc: ReadModeSc,
}

impl WorkloadConfig {
    /// Defaults for `workload` against `host`, namespace `namespace`.
    pub fn new(host: &str, namespace: &str, workload: Workload) -> WorkloadConfig {
        WorkloadConfig {
            hosts: vec![host.to_string()],
            namespace: namespace.to_string(),
            set: "verify".to_string(),
            workload,
            duration: Duration::from_secs(60),
            clients: 10,
            keys: 5,
            ops_per_key: if workload == Workload::Set { 1000 } else { 200 },
            timeout: Duration::from_millis(1000),
            seed: 1,
            read_mode_sc: ReadModeSc::Linearize,
        }
    }
}

/// Operations completed so far, for progress lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub elapsed: Duration,
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
}

/// What the clients share.
struct Shared {
    recorder: Recorder,
    config: WorkloadConfig,
    deadline: Instant,
    /// Per key slot: operations started (picks the slot's current key).
    tickets: Vec<AtomicU64>,
    next_value: AtomicI64,
    counts: [AtomicU64; 3],
}

/// Runs the workload and returns its history. Fails only when no client
/// could connect (or a client task died); operations' errors are history.
pub async fn run(
    config: &WorkloadConfig,
    mut on_progress: impl FnMut(&Progress),
) -> Result<History, String> {
    let config = normalized(config);
    let clients = connect(&config).await?;
    let start = Instant::now();
    let shared = Arc::new(Shared {
        recorder: Recorder::new(),
        deadline: start + config.duration,
        tickets: (0..config.keys).map(|_| AtomicU64::new(0)).collect(),
        next_value: AtomicI64::new(1),
        counts: Default::default(),
        config,
    });
    let mut tasks = Vec::new();
    for (process, client) in clients.iter().enumerate() {
        let (client, shared) = (client.clone(), shared.clone());
        let process = u32::try_from(process).unwrap_or(u32::MAX);
        tasks.push(tokio::spawn(async move {
            worker(process, client, shared).await
        }));
    }
    report_progress(&shared, &tasks, start, &mut on_progress).await;
    for task in tasks {
        task.await
            .map_err(|error| format!("a client task died: {error}"))?;
    }
    if shared.config.workload != Workload::Register {
        let process = u32::try_from(clients.len()).unwrap_or(u32::MAX);
        final_reads(process, &clients[0], &shared).await;
    }
    for client in &clients {
        client.close();
    }
    on_progress(&snapshot(&shared, start));
    Ok(shared.recorder.history())
}

fn normalized(config: &WorkloadConfig) -> WorkloadConfig {
    let mut config = config.clone();
    config.clients = config.clients.max(1);
    config.keys = config.keys.clamp(1, config.clients);
    config.ops_per_key = config.ops_per_key.max(1);
    config
}

async fn connect(config: &WorkloadConfig) -> Result<Vec<Client>, String> {
    let mut clients = Vec::with_capacity(config.clients);
    for _ in 0..config.clients {
        let mut client_config = ClientConfig::new(config.hosts.clone());
        client_config.max_connections_per_node = 4;
        match Client::connect(client_config).await {
            Ok(client) => clients.push(client),
            Err(error) => {
                for client in &clients {
                    client.close();
                }
                return Err(format!(
                    "cannot connect to {}: {error}",
                    config.hosts.join(",")
                ));
            }
        }
    }
    Ok(clients)
}

async fn report_progress(
    shared: &Shared,
    tasks: &[tokio::task::JoinHandle<()>],
    start: Instant,
    on_progress: &mut impl FnMut(&Progress),
) {
    let mut next = start + Duration::from_secs(1);
    while !tasks.iter().all(|task| task.is_finished()) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if Instant::now() >= next {
            next += Duration::from_secs(1);
            on_progress(&snapshot(shared, start));
        }
    }
}

fn snapshot(shared: &Shared, start: Instant) -> Progress {
    let count = |index: usize| shared.counts[index].load(Ordering::Relaxed);
    Progress {
        elapsed: start.elapsed(),
        ok: count(0),
        fail: count(1),
        info: count(2),
    }
}

/// One client: operations until the deadline.
async fn worker(process: u32, client: Client, shared: Arc<Shared>) {
    let config = &shared.config;
    let slot = process as usize % config.keys;
    let mut random = Random::new(config.seed ^ (u64::from(process) + 1).wrapping_mul(0x9E37_79B9));
    // The register value this client last read or wrote, and on which key.
    let mut last: Option<(String, i64)> = None;
    while Instant::now() < shared.deadline {
        let ticket = shared.tickets[slot].fetch_add(1, Ordering::Relaxed);
        let key = match config.workload {
            Workload::Counter => format!("{slot}"),
            _ => format!("{slot}.{}", ticket / config.ops_per_key),
        };
        let known = last
            .as_ref()
            .filter(|(on, _)| *on == key)
            .map(|(_, value)| *value);
        let call = next_call(config.workload, &mut random, &shared.next_value, known);
        let outcome = execute(&client, &shared, process, &key, call.clone()).await;
        match (&call, &outcome) {
            (Call::Read, Outcome::Ok(Reply::Value(Some(value))))
            | (Call::Write(value), Outcome::Ok(_))
            | (Call::Cas { to: value, .. }, Outcome::Ok(_)) => last = Some((key, *value)),
            _ => {}
        }
    }
}

/// The next operation. Register values are unique (every write and CAS
/// writes a value never written before), so a read names the write it
/// saw and the checker can set aside unobserved writes in doubt; a CAS
/// expects the value this client last saw on the key (`known`).
fn next_call(
    workload: Workload,
    random: &mut Random,
    values: &AtomicI64,
    known: Option<i64>,
) -> Call {
    let fresh = || values.fetch_add(1, Ordering::Relaxed);
    match workload {
        Workload::Register => match (random.below(3), known) {
            (0, _) => Call::Read,
            (2, Some(from)) => Call::Cas { from, to: fresh() },
            _ => Call::Write(fresh()),
        },
        Workload::Counter => match random.below(2) {
            0 => Call::Read,
            _ => Call::Add(1 + random.below(5) as i64),
        },
        Workload::Set => Call::Insert(fresh()),
    }
}

/// Records, runs and completes one operation; returns its outcome.
async fn execute(client: &Client, shared: &Shared, process: u32, key: &str, call: Call) -> Outcome {
    let op = shared.recorder.invoke(process, key, call.clone());
    let record_key = Key::new(
        shared.config.namespace.as_str(),
        shared.config.set.as_str(),
        key,
    );
    let outcome = perform(client, &shared.config, &record_key, &call).await;
    let index = match outcome {
        Outcome::Ok(_) => 0,
        Outcome::Fail(_) => 1,
        Outcome::Info(_) => 2,
    };
    shared.counts[index].fetch_add(1, Ordering::Relaxed);
    shared.recorder.complete(process, op, outcome.clone());
    outcome
}

/// Final reads of every key touched, each retried every 200 ms until it
/// succeeds or [`FINAL_READS_WINDOW`] has passed since the first (a
/// cluster healing from a fault — nodes restarting, a view forming — may
/// refuse reads for seconds).
async fn final_reads(process: u32, client: &Client, shared: &Shared) {
    let call = match shared.config.workload {
        Workload::Set => Call::ReadSet,
        _ => Call::Read,
    };
    let deadline = Instant::now() + FINAL_READS_WINDOW;
    for key in keys_used(shared) {
        loop {
            if let Outcome::Ok(_) = execute(client, shared, process, &key, call.clone()).await {
                break;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// How long the final reads may keep trying keys that do not answer.
const FINAL_READS_WINDOW: Duration = Duration::from_secs(30);

/// The keys the clients used, from the slots' tickets (every ticket taken
/// became an operation on the key [`worker`] derived from it).
fn keys_used(shared: &Shared) -> Vec<String> {
    let config = &shared.config;
    let mut keys = Vec::new();
    for (slot, tickets) in shared.tickets.iter().enumerate() {
        let taken = tickets.load(Ordering::Relaxed);
        if taken == 0 {
            continue;
        }
        match config.workload {
            Workload::Counter => keys.push(format!("{slot}")),
            _ => keys
                .extend((0..=(taken - 1) / config.ops_per_key).map(|key| format!("{slot}.{key}"))),
        }
    }
    keys
}

fn policies(config: &WorkloadConfig) -> (ReadPolicy, WritePolicy) {
    let mut read = ReadPolicy {
        read_mode_sc: config.read_mode_sc,
        ..ReadPolicy::default()
    };
    read.base.total_timeout = config.timeout;
    read.base.socket_timeout = config.timeout;
    let mut write = WritePolicy::default();
    write.base.total_timeout = config.timeout;
    write.base.socket_timeout = config.timeout;
    // One attempt: a retried write could apply twice or hide its outcome.
    write.base.max_retries = 0;
    (read, write)
}

async fn perform(client: &Client, config: &WorkloadConfig, key: &Key, call: &Call) -> Outcome {
    let (read, write) = policies(config);
    let done = |result: Result<(), Error>| match result {
        Ok(()) => Outcome::Ok(Reply::Done),
        Err(error) => classify(&error),
    };
    match call {
        Call::Read => read_value(client, &read, key).await.0,
        Call::Write(value) => done(
            client
                .put(&write, key, &[Bin::new(VALUE_BIN, *value)])
                .await,
        ),
        Call::Cas { from, to } => compare_and_set(client, &read, write, key, *from, *to).await,
        Call::Add(delta) => done(
            client
                .add(&write, key, &[Bin::new(VALUE_BIN, *delta)])
                .await,
        ),
        Call::Insert(element) => {
            let append = cdt::list::append(SET_BIN, &Value::Int(*element));
            done(client.operate(&write, key, &[append]).await.map(|_| ()))
        }
        Call::ReadSet => read_set(client, &read, key).await,
    }
}

/// Reads the value bin: the outcome, and the record's generation.
async fn read_value(client: &Client, policy: &ReadPolicy, key: &Key) -> (Outcome, u32) {
    match client
        .get(policy, key, Bins::Names(vec![VALUE_BIN.to_string()]))
        .await
    {
        Ok(None) => (Outcome::Ok(Reply::Value(None)), 0),
        Ok(Some(record)) => match record.bins.get(VALUE_BIN) {
            None => (Outcome::Ok(Reply::Value(None)), record.generation),
            Some(Value::Int(value)) => (Outcome::Ok(Reply::Value(Some(*value))), record.generation),
            Some(other) => (
                Outcome::Fail(format!("bin {VALUE_BIN} holds {other:?}, not an integer")),
                0,
            ),
        },
        Err(error) => (classify(&error), 0),
    }
}

/// Jepsen's Aerospike CAS: read value and generation; if the value is
/// `from`, write `to` only if the generation is still the one read.
async fn compare_and_set(
    client: &Client,
    read: &ReadPolicy,
    mut write: WritePolicy,
    key: &Key,
    from: i64,
    to: i64,
) -> Outcome {
    let (outcome, generation) = read_value(client, read, key).await;
    match outcome {
        Outcome::Ok(Reply::Value(Some(value))) if value == from => {}
        Outcome::Ok(Reply::Value(seen)) => {
            return Outcome::Fail(format!("value was {seen:?}, not {from}"));
        }
        // Nothing was written yet: whatever happened to the read, the CAS failed.
        Outcome::Ok(_) | Outcome::Fail(_) | Outcome::Info(_) => {
            return Outcome::Fail("its read failed".to_string());
        }
    }
    write.generation = GenerationPolicy::ExpectEqual(generation);
    match client.put(&write, key, &[Bin::new(VALUE_BIN, to)]).await {
        Ok(()) => Outcome::Ok(Reply::Done),
        Err(error) => classify(&error),
    }
}

async fn read_set(client: &Client, policy: &ReadPolicy, key: &Key) -> Outcome {
    let record = match client
        .get(policy, key, Bins::Names(vec![SET_BIN.to_string()]))
        .await
    {
        Ok(record) => record,
        Err(error) => return classify(&error),
    };
    let Some(value) = record.and_then(|mut record| record.bins.remove(SET_BIN)) else {
        return Outcome::Ok(Reply::Elements(Vec::new()));
    };
    let Some(Element::List(items)) = value.elements() else {
        return Outcome::Fail(format!("bin {SET_BIN} is not a list: {value:?}"));
    };
    let mut elements = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Element::Int(element) => elements.push(element),
            other => return Outcome::Fail(format!("bin {SET_BIN} holds {other:?}")),
        }
    }
    Outcome::Ok(Reply::Elements(elements))
}

/// The outcome an error means (see the module doc).
pub fn classify(error: &Error) -> Outcome {
    let text = error.to_string();
    match error {
        Error::Server { code: 9, .. } => Outcome::Info(text),
        Error::Server { in_doubt, .. } if *in_doubt => Outcome::Info(text),
        Error::Network { .. } | Error::Timeout { .. } | Error::Protocol { .. } => {
            Outcome::Info(text)
        }
        _ => Outcome::Fail(text),
    }
}

/// xorshift64*: the clients' random choices (reproducible from the seed).
struct Random(u64);

impl Random {
    fn new(seed: u64) -> Random {
        Random(seed | 1)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % bound.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_onto_outcomes() {
        let fail = |outcome: Outcome| matches!(outcome, Outcome::Fail(_));
        let info = |outcome: Outcome| matches!(outcome, Outcome::Info(_));
        assert!(
            fail(classify(&Error::server(3, "n"))),
            "generation mismatch"
        );
        assert!(fail(classify(&Error::server(11, "n"))), "unavailable");
        assert!(info(classify(&Error::server(9, "n"))), "server timeout");
        let timeout = Error::Timeout {
            what: "total",
            iterations: 1,
            in_doubt: false,
        };
        assert!(info(classify(&timeout)));
        let network = Error::Network {
            address: "a".into(),
            message: "reset".into(),
            in_doubt: true,
        };
        assert!(info(classify(&network)));
        assert!(fail(classify(&Error::InvalidArgument("x".into()))));
    }

    #[test]
    fn workload_names_round_trip() {
        for workload in [Workload::Register, Workload::Counter, Workload::Set] {
            assert_eq!(workload.name().parse::<Workload>(), Ok(workload));
        }
        assert!("bank".parse::<Workload>().is_err());
    }
}
