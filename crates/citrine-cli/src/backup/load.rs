//! `citrine restore`: a backup file into a cluster.
//!
//! A reader thread parses the file (decrypted and decompressed on the
//! way) and hands entries over a bounded channel; the UDF modules and
//! index definitions, which come first, are applied as they arrive, before
//! any record; records go in batch write commands of `--batch-size`
//! records, up to `--max-async-batches` in flight (what asrestore's batch
//! mode does), or with `--disable-batch-writes` each record in a write of
//! its own, up to `--parallel` in flight; either way paced by `--tps`. A damaged file ends the reading at the
//! damage: the writes already under way finish, the summary is printed,
//! and the error names the line (and the line the record began on).
//!
//! Outcomes are counted by reason: restored; skipped because the cluster
//! holds the record already (`--unique`) or holds the same or a higher
//! generation, or because it expired, or has no bins left; failed with the
//! server's answer.

use super::io::open_source;
use super::progress::{by_reason, rates, Counters, Ticker};
use super::RestoreArgs;
use crate::record::connect;
use crate::CliResult;
use citrine_backup::{Entry, Reader, Record};
use citrine_client::{
    BatchPolicy, BatchWrite, Bin, Client, Expiration, GenerationPolicy, IndexCollection, IndexType,
    Key, Operation, RecordExistsAction, Value, WritePolicy,
};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Semaphore};

/// What the reader thread sends.
enum Message {
    /// The header was read: the file's namespace, if it names one.
    Header(Option<String>),
    /// An entry and the line it began on.
    Entry(u64, Entry),
    /// The file cannot be read further.
    Failed(String),
}

/// What the writes share.
struct Target {
    client: Client,
    policy: WritePolicy,
    counters: Arc<Counters>,
    /// The namespaces the cluster has.
    namespaces: Vec<String>,
    /// (source, target) of `--namespace`.
    rename: Option<(String, String)>,
    sets: Vec<String>,
    bins: Vec<String>,
    /// Write only over a lower generation (not `--no-generation`).
    generation_check: bool,
}

pub async fn run(args: RestoreArgs) -> CliResult {
    let transform = args.file.transform()?;
    let rename = args
        .namespace
        .as_deref()
        .map(|text| match text.split_once(',') {
            Some((source, target)) => (source.to_owned(), target.to_owned()),
            None => (text.to_owned(), text.to_owned()),
        });
    let file_size = std::fs::metadata(&args.input)
        .map_err(|error| format!("cannot read {}: {error}", args.input.display()))?
        .len();
    let client = connect(&args.host).await?;
    let counters = Arc::new(Counters::default());
    counters.total.store(file_size, Ordering::Relaxed);
    counters.total_is_bytes.store(true, Ordering::Relaxed);
    let source = open_source(&args.input, &transform, counters.bytes.clone())?;
    let target = Arc::new(Target {
        namespaces: namespaces(&client).await?,
        policy: write_policy(&args),
        client,
        counters: counters.clone(),
        rename,
        sets: args.sets.clone(),
        bins: args.bins.clone(),
        // A create-only write needs no generation check.
        generation_check: !args.no_generation && !args.unique,
    });
    let (sender, receiver) = mpsc::channel(4096);
    let reader = std::thread::spawn(move || read_file(source, sender));
    let started = Instant::now();
    let ticker = Ticker::start(
        counters.clone(),
        "restore",
        Duration::from_secs(args.file.progress_interval),
    );
    let outcome = apply(&target, &args, receiver).await;
    drop(ticker);
    let _ = reader.join();
    summary(&target, &args, started, &outcome);
    match outcome.error {
        Some(error) => Err(format!(
            "{}: {error}\n  the restore stopped there; the records before it were written",
            args.input.display()
        )),
        None if !counters.failed().is_empty() => Err(format!(
            "some records could not be written: {}",
            by_reason(&counters.failed())
        )),
        None => Ok(ExitCode::SUCCESS),
    }
}

async fn namespaces(client: &Client) -> Result<Vec<String>, String> {
    let node = client
        .nodes()
        .first()
        .map(|node| node.id)
        .ok_or("the cluster has no node")?;
    let answer = client
        .info(node, &["namespaces"])
        .await
        .map_err(|error| error.to_string())?;
    Ok(answer
        .get("namespaces")
        .map(|text| {
            text.split(';')
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default())
}

fn write_policy(args: &RestoreArgs) -> WritePolicy {
    let mut policy = WritePolicy {
        record_exists: if args.unique {
            RecordExistsAction::CreateOnly
        } else if args.replace {
            RecordExistsAction::Replace
        } else {
            RecordExistsAction::Update
        },
        ..WritePolicy::default()
    };
    policy.base.total_timeout = Duration::from_millis(args.host.timeout_ms.max(1000) * 5);
    policy.base.socket_timeout = Duration::from_millis(args.host.timeout_ms);
    policy.base.max_retries = 5;
    policy
}

/// The reader thread: parses until the end or the first error.
fn read_file(source: Box<dyn std::io::BufRead + Send>, sender: mpsc::Sender<Message>) {
    let send = |message| sender.blocking_send(message).is_ok();
    let mut reader = match Reader::new(source) {
        Ok(reader) => reader,
        Err(error) => {
            send(Message::Failed(error.to_string()));
            return;
        }
    };
    if !send(Message::Header(reader.namespace().map(str::to_owned))) {
        return;
    }
    loop {
        match reader.next_entry() {
            Ok(Some(entry)) => {
                if !send(Message::Entry(reader.entry_line(), entry)) {
                    return;
                }
            }
            Ok(None) => return,
            Err(error) => {
                send(Message::Failed(error.to_string()));
                return;
            }
        }
    }
}

/// How the restore went.
#[derive(Default)]
struct Outcome {
    read: u64,
    udfs: u64,
    indexes: u64,
    error: Option<String>,
}

/// Where prepared records go: single writes, or batches being filled.
struct Writer {
    slots: Arc<Semaphore>,
    writes: tokio::task::JoinSet<()>,
    /// Records per batch; 0: single writes.
    batch_size: usize,
    batch: Vec<BatchWrite>,
}

impl Writer {
    fn new(args: &RestoreArgs) -> Writer {
        let (in_flight, batch_size) = match args.disable_batch_writes {
            true => (args.parallel, 0),
            false => (args.max_async_batches, args.batch_size.max(1)),
        };
        Writer {
            slots: Arc::new(Semaphore::new(in_flight.max(1))),
            writes: tokio::task::JoinSet::new(),
            batch_size,
            batch: Vec::new(),
        }
    }

    /// Writes one record, or adds it to the batch (sent once full);
    /// `false` if no more writes can start.
    async fn push(&mut self, target: &Arc<Target>, (key, policy, bins): Prepared) -> bool {
        if self.batch_size == 0 {
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                return false;
            };
            let target = target.clone();
            self.writes.spawn(async move {
                count(&target, target.client.put(&policy, &key, &bins).await);
                drop(slot);
            });
            return true;
        }
        let ops = bins.into_iter().map(Operation::Write).collect();
        self.batch.push(BatchWrite { key, policy, ops });
        self.batch.len() < self.batch_size || self.flush(target).await
    }

    /// Sends the batch being filled, if it has rows.
    async fn flush(&mut self, target: &Arc<Target>) -> bool {
        if self.batch.is_empty() {
            return true;
        }
        let Ok(slot) = self.slots.clone().acquire_owned().await else {
            return false;
        };
        let rows = std::mem::take(&mut self.batch);
        let target = target.clone();
        self.writes.spawn(async move {
            write_batch(&target, rows).await;
            drop(slot);
        });
        true
    }

    /// Sends what is left and waits for every write.
    async fn finish(mut self, target: &Arc<Target>) {
        self.flush(target).await;
        while self.writes.join_next().await.is_some() {}
    }
}

/// One record's write: its key, policy and bins.
type Prepared = (Key, WritePolicy, Vec<Bin>);

async fn apply(
    target: &Arc<Target>,
    args: &RestoreArgs,
    mut receiver: mpsc::Receiver<Message>,
) -> Outcome {
    let mut outcome = Outcome::default();
    let mut writer = Writer::new(args);
    let pace = (args.tps > 0).then(|| Duration::from_secs_f64(1.0 / f64::from(args.tps)));
    let mut next_write = tokio::time::Instant::now();
    while let Some(message) = receiver.recv().await {
        let result = match message {
            Message::Header(namespace) => check_header(target, namespace),
            Message::Entry(_, Entry::Udf(file)) if !args.no_udfs => {
                restore_udf(target, &file.name, &file.content, &mut outcome).await;
                Ok(())
            }
            Message::Entry(line, Entry::Index(def)) if !args.no_indexes => {
                restore_index(target, line, def, &mut outcome).await
            }
            Message::Entry(line, Entry::Record(record)) if !args.no_records => {
                outcome.read += 1;
                match prepare(target, line, record) {
                    Ok(Some(prepared)) => {
                        if let Some(pace) = pace {
                            tokio::time::sleep_until(next_write).await;
                            next_write = next_write.max(tokio::time::Instant::now() - pace) + pace;
                        }
                        if !writer.push(target, prepared).await {
                            break;
                        }
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(error) => Err(error),
                }
            }
            Message::Entry(..) => Ok(()),
            Message::Failed(error) => Err(error),
        };
        if let Err(error) = result {
            outcome.error = Some(error);
            break;
        }
        while writer.writes.try_join_next().is_some() {}
    }
    writer.finish(target).await;
    outcome
}

fn check_header(target: &Target, namespace: Option<String>) -> Result<(), String> {
    let Some(namespace) = namespace else {
        return Ok(());
    };
    let name = target_namespace(target, &namespace);
    if target.namespaces.contains(&name) {
        return Ok(());
    }
    Err(format!(
        "line 2: the backup is of namespace {namespace}, which the cluster does not have \
         (it has: {}); restore it into another with --namespace {namespace},OTHER",
        target.namespaces.join(", ")
    ))
}

fn target_namespace(target: &Target, namespace: &str) -> String {
    match &target.rename {
        Some((source, to)) if source == namespace => to.clone(),
        _ => namespace.to_owned(),
    }
}

async fn restore_udf(target: &Target, name: &str, content: &[u8], outcome: &mut Outcome) {
    match target.client.register_udf(name, content).await {
        Ok(()) => outcome.udfs += 1,
        Err(error) => target.counters.fail(format!("UDF module {name}: {error}")),
    }
}

async fn restore_index(
    target: &Target,
    line: u64,
    def: citrine_backup::IndexDef,
    outcome: &mut Outcome,
) -> Result<(), String> {
    let namespace = target_namespace(target, &def.namespace);
    if !target.namespaces.contains(&namespace) {
        return Err(format!(
            "line {line}: index {} is of namespace {namespace}, which the cluster does not have",
            def.name
        ));
    }
    let index_type = match def.key_type {
        b'N' => IndexType::Numeric,
        b'S' => IndexType::String,
        b'B' => IndexType::Blob,
        _ => IndexType::Geo2DSphere,
    };
    let collection = match def.collection {
        b'L' => IndexCollection::List,
        b'K' => IndexCollection::MapKeys,
        b'V' => IndexCollection::MapValues,
        _ => IndexCollection::Default,
    };
    let context = match &def.context {
        Some(text) => Some(
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, text).map_err(
                |_| format!("line {line}: index {}: its context is not base64", def.name),
            )?,
        ),
        None => None,
    };
    let created = target
        .client
        .create_index(
            &namespace,
            &def.set,
            &def.name,
            &def.bin,
            index_type,
            collection,
            context.as_deref(),
        )
        .await;
    match created {
        Ok(()) => outcome.indexes += 1,
        Err(error) if error.to_string().contains("200") || error.to_string().contains("exists") => {
            target.counters.skip("index already on the cluster")
        }
        Err(error) => target.counters.fail(format!("index {}: {error}", def.name)),
    }
    Ok(())
}

/// The key, policy and bins of one record's write; `None` when the record
/// is skipped (counted); an error stops the restore.
fn prepare(target: &Target, line: u64, record: Record) -> Result<Option<Prepared>, String> {
    let namespace = target_namespace(target, &record.namespace);
    if !target.namespaces.contains(&namespace) {
        return Err(format!(
            "line {line}: the record that starts here is of namespace {namespace}, which the \
             cluster does not have (it has: {})",
            target.namespaces.join(", ")
        ));
    }
    if !target.sets.is_empty() && !target.sets.contains(&record.set) {
        return Ok(None);
    }
    let mut policy = target.policy.clone();
    policy.expiration = match record.expiry {
        0 => Expiration::Never,
        expiry => {
            let now = citrine_types::citrusleaf_epoch_seconds(unix_ms());
            if expiry <= now {
                target.counters.skip("expired");
                return Ok(None);
            }
            Expiration::Seconds(expiry - now)
        }
    };
    if target.generation_check {
        policy.generation = GenerationPolicy::ExpectGreater(u32::from(record.generation));
    }
    policy.base.send_key = record.key.is_some();
    let bins: Vec<Bin> = record
        .bins
        .into_iter()
        .filter(|bin| target.bins.is_empty() || target.bins.contains(&bin.name))
        .map(|bin| Bin {
            name: bin.name,
            value: match bin.particle {
                0 => Value::Nil,
                particle => Value::Raw {
                    particle,
                    bytes: bin.bytes,
                },
            },
        })
        .collect();
    if bins.is_empty() {
        target.counters.skip("no bins to write");
        return Ok(None);
    }
    let key = Key {
        namespace,
        set: record.set,
        user_key: record.key,
        digest: record.digest,
    };
    Ok(Some((key, policy, bins)))
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

/// Sends one batch write command; counts each row's outcome (a failed
/// command: each row failed with its error).
async fn write_batch(target: &Target, rows: Vec<BatchWrite>) {
    let policy = BatchPolicy {
        base: target.policy.base.clone(),
        ..BatchPolicy::default()
    };
    match target.client.batch_write(&policy, &rows).await {
        Ok(results) => {
            for result in results {
                count(target, result);
            }
        }
        Err(error) => {
            for _ in &rows {
                count(target, Err(error.clone()));
            }
        }
    }
}

/// Counts one record's write outcome by reason.
fn count(target: &Target, result: citrine_client::Result<()>) {
    match result {
        Ok(()) => {
            target.counters.records.fetch_add(1, Ordering::Relaxed);
        }
        Err(error) => match error.raw_code() {
            Some(3) => target
                .counters
                .skip("the cluster holds the same or a higher generation"),
            Some(5) => target.counters.skip("already on the cluster (--unique)"),
            Some(_) => target.counters.fail(match error.result_code() {
                Some(code) => code.to_string(),
                None => format!("result code {}", error.raw_code().unwrap_or(0)),
            }),
            None => target.counters.fail(error.to_string()),
        },
    }
}

fn summary(target: &Target, args: &RestoreArgs, started: Instant, outcome: &Outcome) {
    let counters = &target.counters;
    outln!(
        "restore of {}: {} in {:.1} s",
        args.input.display(),
        rates(counters, started.elapsed()),
        started.elapsed().as_secs_f64()
    );
    outln!(
        "  {} records read, {} restored, {} bytes of the file read; {} UDF modules, {} secondary indexes",
        outcome.read,
        counters.records.load(Ordering::Relaxed),
        counters.bytes.load(Ordering::Relaxed),
        outcome.udfs,
        outcome.indexes
    );
    outln!("  skipped: {}", by_reason(&counters.skipped()));
    outln!("  failed: {}", by_reason(&counters.failed()));
}
