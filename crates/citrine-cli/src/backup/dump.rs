//! `citrine backup`: a namespace to one file.
//!
//! Steps: connect; choose the partitions (all, a partition list, or those
//! the named nodes master) and order them so consecutive ones belong to
//! different masters; write the header, index definitions and UDF modules;
//! then `--parallel` workers each take the next partition and stream it
//! from its master (a partition scan returning raw bins), encoding records
//! into a block that goes to the file — under one lock, with the journal
//! line that records it — every 1 MiB and at the partition's end. A
//! failure stops the workers and leaves the journal for `--continue`.
//!
//! Invariant: the journal never claims more than the file holds, and a
//! partition's records are in the file at most once after any number of
//! interruptions (a resumed partition restarts after its last journaled
//! digest, and the file is cut back to the last journaled length).

use super::io::{compress, Sink, Transform};
use super::progress::{by_reason, rates, Counters, Ticker};
use super::state::{self, Journal, Progress};
use super::{backup_filter, parse_partitions, BackupArgs};
use crate::record::connect;
use crate::CliResult;
use citrine_backup::{write, Bin, IndexDef, Record, UdfFile};
use citrine_client::{
    Bins, Client, KeyRecord, NodeId, PartitionFilter, ScanPolicy, Statement, Value,
};
use citrine_types::Digest;
use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of text a worker gathers before writing them out.
const BLOCK: usize = 1 << 20;

/// Partitions still to back up, each after the digest it reached.
type Queue = VecDeque<(u16, Option<Digest>)>;

/// The file and its journal, written together.
struct Output {
    sink: Sink,
    journal: Journal,
}

/// What every worker shares.
struct Shared {
    client: Client,
    policy: ScanPolicy,
    statement: Statement,
    compact: bool,
    transform: Transform,
    output: Mutex<Output>,
    counters: Arc<Counters>,
    queue: Mutex<Queue>,
    /// Set when a worker failed: the others stop at their next block.
    stop: std::sync::atomic::AtomicBool,
}

pub async fn run(args: BackupArgs) -> CliResult {
    let transform = args.file.transform()?;
    let filter = backup_filter(&args)?;
    let listed = parse_partitions(&args.partition_list)?;
    if args.parallel == 0 {
        return Err("--parallel must be at least 1".into());
    }
    let client = connect(&args.host).await?;
    check_namespace(&client, &args.namespace).await?;
    let partitions = scope(&client, &args, listed).await?;
    let run_line = run_line(&args);
    let state_path = state::path_for(&args.output);
    let started = Instant::now();
    let counters = Arc::new(Counters::default());
    let continued = match args.resume {
        true => resume(&args, &transform, &state_path, &run_line, &partitions)?,
        false => None,
    };
    let resumed = continued.is_some();
    let (output, queue) = match continued {
        Some(continued) => continued,
        None => {
            let sink = Sink::create(&args.output, &transform)?;
            let journal = Journal::create(&state_path, &run_line)?;
            let queue = partitions.iter().map(|p| (*p, None)).collect();
            (Output { sink, journal }, queue)
        }
    };
    let shared = Arc::new(Shared {
        client: client.clone(),
        policy: scan_policy(&args, filter),
        statement: statement(&args),
        compact: args.compact,
        transform,
        output: Mutex::new(output),
        counters: counters.clone(),
        queue: Mutex::new(queue),
        stop: Default::default(),
    });
    let (indexes, udfs) = write_globals(&shared, &args, resumed).await?;
    let mut failure = None;
    if !args.no_records {
        estimate(&shared, &args, partitions.len()).await;
        let ticker = Ticker::start(
            counters.clone(),
            "backup",
            Duration::from_secs(args.file.progress_interval),
        );
        failure = run_workers(&shared, args.parallel).await.err();
        drop(ticker);
    }
    finish(shared, &args, started, indexes, udfs, failure)
}

/// Writes the summary; removes the journal when everything was written.
fn finish(
    shared: Arc<Shared>,
    args: &BackupArgs,
    started: Instant,
    indexes: usize,
    udfs: usize,
    failure: Option<String>,
) -> CliResult {
    let counters = &shared.counters;
    let mut output = shared
        .output
        .lock()
        .map_err(|_| "a backup worker panicked".to_string())?;
    output.sink.sync()?;
    let skipped = counters.skipped();
    let failed = counters.failed();
    outln!(
        "backup of namespace {} to {}: {} in {:.1} s",
        args.namespace,
        args.output.display(),
        rates(counters, started.elapsed()),
        started.elapsed().as_secs_f64()
    );
    outln!(
        "  {} records, {} bytes of text, {} bytes in the file; {indexes} secondary indexes, {udfs} UDF modules",
        counters.records.load(Ordering::Relaxed),
        counters.bytes.load(Ordering::Relaxed),
        output.sink.length()
    );
    outln!("  skipped: {}", by_reason(&skipped));
    outln!("  failed: {}", by_reason(&failed));
    if let Some(failure) = failure {
        return Err(format!(
            "{failure}\n  the backup stopped; what it wrote is kept: run the same command with \
             --continue to finish it (state in {})",
            output.journal.path.display()
        ));
    }
    drop(output);
    if let Ok(output) = Arc::try_unwrap(shared).map(|shared| shared.output) {
        if let Ok(output) = output.into_inner() {
            output.journal.remove();
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn check_namespace(client: &Client, namespace: &str) -> Result<(), String> {
    let node = client
        .nodes()
        .first()
        .map(|node| node.id)
        .ok_or("the cluster has no node")?;
    let answer = client
        .info(node, &["namespaces"])
        .await
        .map_err(|error| error.to_string())?;
    let names = answer.get("namespaces").cloned().unwrap_or_default();
    if names.split(';').any(|name| name == namespace) {
        return Ok(());
    }
    Err(format!(
        "namespace {namespace} does not exist on the cluster (it has: {})",
        names.replace(';', ", ")
    ))
}

/// The partitions to back up, ordered so that neighbours have different
/// masters (the workers then keep every node busy).
async fn scope(client: &Client, args: &BackupArgs, listed: Vec<u16>) -> Result<Vec<u16>, String> {
    let mut partitions: Vec<u16> = if listed.is_empty() {
        (0..4096).collect()
    } else {
        listed
    };
    let master = |p: u16| client.master_of_partition(&args.namespace, p);
    if !args.node_list.is_empty() {
        let wanted = nodes_named(client, &args.node_list).await?;
        partitions.retain(|p| master(*p).is_some_and(|node| wanted.contains(&node)));
        if partitions.is_empty() {
            return Err("the nodes of --node-list master no partition of the namespace".into());
        }
    }
    let mut by_master: Vec<(Option<NodeId>, VecDeque<u16>)> = Vec::new();
    for partition in partitions {
        let node = master(partition);
        match by_master.iter_mut().find(|(id, _)| *id == node) {
            Some((_, list)) => list.push_back(partition),
            None => by_master.push((node, VecDeque::from([partition]))),
        }
    }
    let mut ordered = Vec::new();
    while by_master.iter().any(|(_, list)| !list.is_empty()) {
        for (_, list) in &mut by_master {
            ordered.extend(list.pop_front());
        }
    }
    Ok(ordered)
}

async fn nodes_named(client: &Client, hosts: &[String]) -> Result<Vec<NodeId>, String> {
    let mut ids = Vec::new();
    for host in hosts {
        let addresses: Vec<std::net::SocketAddr> = tokio::net::lookup_host(host)
            .await
            .map_err(|error| format!("--node-list {host}: {error}"))?
            .collect();
        let node = client
            .nodes()
            .into_iter()
            .find(|node| addresses.contains(&node.address))
            .ok_or_else(|| {
                format!("--node-list {host}: no node of the cluster is at that address")
            })?;
        ids.push(node.id);
    }
    Ok(ids)
}

/// The options that shape the file: a continued backup must use the same.
fn run_line(args: &BackupArgs) -> String {
    format!(
        "ns={:?} sets={:?} bins={:?} after={:?} before={:?} exp={:?} nodes={:?} partitions={:?} compact={} zstd={} aes={:?}",
        args.namespace,
        args.sets,
        args.bins,
        args.modified_after,
        args.modified_before,
        args.filter_exp,
        args.node_list,
        args.partition_list,
        args.compact,
        args.file.compress.is_some(),
        args.file.encrypt
    )
}

/// The output and the queue of a continued backup; `None` when the state
/// file (of the same options) records nothing written yet: the interrupted
/// run stopped before its header, so the backup starts afresh.
fn resume(
    args: &BackupArgs,
    transform: &Transform,
    state_path: &std::path::Path,
    run_line: &str,
    partitions: &[u16],
) -> Result<Option<(Output, Queue)>, String> {
    let (journal, saved) = Journal::resume(state_path, run_line).map_err(|error| {
        format!("cannot continue: {error} (without --continue the backup starts afresh)")
    })?;
    if saved.header_length.is_none() {
        eprintln!(
            "{} records nothing written yet: the backup starts afresh",
            state_path.display()
        );
        return Ok(None);
    }
    let sink = Sink::resume(&args.output, transform, saved.length)?;
    let queue = partitions
        .iter()
        .filter_map(|&p| match saved.partitions.get(&p) {
            Some(Progress::Done) => None,
            Some(Progress::After(digest)) => Some((p, Some(Digest(*digest)))),
            None => Some((p, None)),
        })
        .collect();
    Ok(Some((Output { sink, journal }, queue)))
}

fn scan_policy(args: &BackupArgs, filter: Option<Vec<u8>>) -> ScanPolicy {
    let mut policy = ScanPolicy {
        records_per_second: args.records_per_second,
        raw_values: true,
        ..ScanPolicy::default()
    };
    policy.base.send_key = false;
    policy.base.filter = filter.map(Arc::from);
    policy
}

fn statement(args: &BackupArgs) -> Statement {
    let set = if args.sets.len() == 1 {
        args.sets[0].clone()
    } else {
        String::new()
    };
    let mut statement = Statement::new(args.namespace.clone(), set);
    if !args.bins.is_empty() {
        statement = statement.bins(Bins::Names(args.bins.clone()));
    }
    statement
}

/// The header, then the index definitions and UDF modules; journaled.
async fn write_globals(
    shared: &Shared,
    args: &BackupArgs,
    resumed: bool,
) -> Result<(usize, usize), String> {
    if resumed {
        return Ok((0, 0));
    }
    let mut text = Vec::new();
    write::header(&mut text, &args.namespace, true);
    let mut indexes = 0;
    if !args.no_indexes {
        for def in index_defs(shared, args).await? {
            write::index(&mut text, &def);
            indexes += 1;
        }
    }
    let mut udfs = 0;
    if !args.no_udfs {
        for file in udf_files(&shared.client).await? {
            write::udf(&mut text, &file);
            udfs += 1;
        }
    }
    shared
        .counters
        .bytes
        .fetch_add(text.len() as u64, Ordering::Relaxed);
    let block = compress(&shared.transform, text)?;
    let mut output = shared.output.lock().map_err(|_| "lock poisoned")?;
    let length = output.sink.write_block(block)?;
    output.journal.header(length)?;
    Ok((indexes, udfs))
}

/// The namespace's secondary indexes that the format can hold (on the
/// sets backed up); the others are counted as skipped.
async fn index_defs(shared: &Shared, args: &BackupArgs) -> Result<Vec<IndexDef>, String> {
    let node = shared
        .client
        .nodes()
        .first()
        .map(|node| node.id)
        .ok_or("the cluster has no node")?;
    let command = format!("sindex-list:ns={};b64=true", args.namespace);
    let answer = shared
        .client
        .info(node, &[&command])
        .await
        .map_err(|error| format!("cannot list the secondary indexes: {error}"))?;
    let text = answer.get(&command).cloned().unwrap_or_default();
    let mut defs = Vec::new();
    for entry in text.split(';').filter(|entry| !entry.trim().is_empty()) {
        match index_def(entry) {
            Ok(def) if args.sets.is_empty() || args.sets.contains(&def.set) => defs.push(def),
            Ok(_) => {}
            Err(reason) => shared.counters.skip(reason),
        }
    }
    Ok(defs)
}

/// One `sindex-list` entry (`ns=..:indexname=..:set=..:bin=..:type=..:
/// indextype=..:context=..:exp=..`) as an index line.
fn index_def(entry: &str) -> Result<IndexDef, String> {
    let field = |name: &str| {
        entry
            .split(':')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            // The reference writes `null`, Citrine `NULL`.
            .filter(|value| !value.eq_ignore_ascii_case("null"))
            .map(str::to_owned)
    };
    let name = field("indexname").unwrap_or_default();
    if field("exp").is_some() {
        return Err(format!("index {name}: on an expression (no backup form)"));
    }
    let key_type = match field("type")
        .unwrap_or_default()
        .to_ascii_lowercase()
        .as_str()
    {
        "numeric" => b'N',
        "string" => b'S',
        "blob" => b'B',
        "geo2dsphere" => b'G',
        other => return Err(format!("index {name}: of type {other:?} (no backup form)")),
    };
    let collection = match field("indextype")
        .unwrap_or_default()
        .to_ascii_lowercase()
        .as_str()
    {
        "default" | "none" | "" => b'N',
        "list" => b'L',
        "mapkeys" => b'K',
        "mapvalues" => b'V',
        other => return Err(format!("index {name}: of kind {other:?} (no backup form)")),
    };
    Ok(IndexDef {
        namespace: field("ns").unwrap_or_default(),
        set: field("set").unwrap_or_default(),
        name,
        collection,
        bin: field("bin").ok_or("an index without a bin")?,
        key_type,
        context: field("context"),
    })
}

async fn udf_files(client: &Client) -> Result<Vec<UdfFile>, String> {
    let modules = client
        .list_udfs()
        .await
        .map_err(|error| format!("cannot list the UDF modules: {error}"))?;
    let mut files = Vec::new();
    for module in modules {
        let content = client
            .get_udf(&module.filename)
            .await
            .map_err(|error| format!("cannot read UDF module {}: {error}", module.filename))?
            .ok_or_else(|| format!("UDF module {} vanished while being read", module.filename))?;
        files.push(UdfFile {
            name: module.filename,
            content,
        });
    }
    Ok(files)
}

/// The records the backup will hold, for the ETA: the namespace's master
/// objects over every node, in proportion to the partitions backed up.
async fn estimate(shared: &Shared, args: &BackupArgs, partitions: usize) {
    let command = format!("namespace/{}", args.namespace);
    let mut total = 0u64;
    for (_, answer) in shared.client.info_all(&[&command]).await {
        let Ok(answer) = answer else { continue };
        let text = answer.get(&command).cloned().unwrap_or_default();
        total += text
            .split(';')
            .find_map(|pair| pair.strip_prefix("master_objects="))
            .and_then(|value| value.parse::<u64>().ok())
            .unwrap_or(0);
    }
    if args.sets.is_empty() && args.modified_after.is_none() && args.modified_before.is_none() {
        let share = total as u128 * partitions as u128 / 4096;
        shared.counters.total.store(share as u64, Ordering::Relaxed);
    }
}

async fn run_workers(shared: &Arc<Shared>, parallel: usize) -> Result<(), String> {
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..parallel {
        let shared = shared.clone();
        workers.spawn(async move { worker(&shared).await });
    }
    let mut first_error = None;
    while let Some(outcome) = workers.join_next().await {
        let error = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error,
            Err(panic) => format!("a backup worker failed: {panic}"),
        };
        shared.stop.store(true, Ordering::Relaxed);
        first_error.get_or_insert(error);
    }
    first_error.map_or(Ok(()), Err)
}

async fn worker(shared: &Shared) -> Result<(), String> {
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let next = shared
            .queue
            .lock()
            .map_err(|_| "lock poisoned")?
            .pop_front();
        let Some((partition, after)) = next else {
            return Ok(());
        };
        backup_partition(shared, partition, after).await?;
    }
}

/// Streams one partition from its master into the file.
async fn backup_partition(
    shared: &Shared,
    partition: u16,
    after: Option<Digest>,
) -> Result<(), String> {
    let mut statement = shared.statement.clone();
    statement.partitions =
        PartitionFilter::partition_after(partition, after).map_err(|error| error.to_string())?;
    let mut stream = shared
        .client
        .scan(&shared.policy, &statement)
        .map_err(|error| format!("partition {partition}: {error}"))?;
    let mut block = Vec::with_capacity(BLOCK + BLOCK / 4);
    while let Some(item) = stream.next().await {
        let key_record = item.map_err(|error| format!("partition {partition}: {error}"))?;
        let digest = key_record.key.digest;
        let before = block.len();
        match write::record(&mut block, &backup_record(key_record), shared.compact) {
            Ok(()) => {
                shared.counters.records.fetch_add(1, Ordering::Relaxed);
                let written = (block.len() - before) as u64;
                shared.counters.bytes.fetch_add(written, Ordering::Relaxed);
            }
            Err(error) => shared.counters.skip(skip_reason(&error)),
        }
        if block.len() >= BLOCK {
            if shared.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let full = std::mem::replace(&mut block, Vec::with_capacity(BLOCK + BLOCK / 4));
            flush(shared, partition, full, Some(digest))?;
        }
    }
    flush(shared, partition, block, None)
}

/// Writes a block and journals it: a partial step up to `last`, or the
/// partition's end when `last` is `None`.
fn flush(
    shared: &Shared,
    partition: u16,
    text: Vec<u8>,
    last: Option<Digest>,
) -> Result<(), String> {
    let block = if text.is_empty() {
        text
    } else {
        compress(&shared.transform, text)?
    };
    let mut output = shared.output.lock().map_err(|_| "lock poisoned")?;
    let length = if block.is_empty() {
        output.sink.length()
    } else {
        output.sink.write_block(block)?
    };
    match last {
        Some(digest) => output.journal.partial(partition, digest.0, length),
        None => output.journal.done(partition, length),
    }
}

/// "bin \"x\": particle type 99 has no backup form" → the part after the bin.
fn skip_reason(error: &str) -> String {
    error
        .split_once(": ")
        .map_or(error, |(_, reason)| reason)
        .to_owned()
}

fn backup_record(key_record: KeyRecord) -> Record {
    let KeyRecord { key, record } = key_record;
    let bins = record
        .bins
        .into_iter()
        .map(|(name, value)| match value {
            Value::Raw { particle, bytes } => Bin {
                name,
                particle,
                bytes,
            },
            other => Bin {
                name,
                particle: other.particle_type(),
                bytes: other.encode(),
            },
        })
        .collect();
    Record {
        key: key.user_key,
        namespace: key.namespace,
        digest: key.digest,
        set: key.set,
        // Generations are 16 bits on the server; the wire carries 32.
        generation: record.generation as u16,
        expiry: record.void_time,
        bins,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_listings_become_index_lines() {
        let def = index_def(
            "ns=test:indexname=by_age:set=people:bin=age:type=numeric:indextype=default:context=NULL:exp=NULL:state=RW",
        )
        .expect("an index");
        assert_eq!(
            (
                def.namespace.as_str(),
                def.set.as_str(),
                def.name.as_str(),
                def.bin.as_str()
            ),
            ("test", "people", "by_age", "age")
        );
        assert_eq!(
            (def.collection, def.key_type, def.context),
            (b'N', b'N', None)
        );
        let listed = index_def(
            "ns=test:indexname=tags:set=NULL:bin=t:type=string:indextype=list:context=kgEA:exp=NULL",
        )
        .expect("an index");
        assert_eq!((listed.collection, listed.key_type), (b'L', b'S'));
        assert_eq!(
            (listed.set.as_str(), listed.context.as_deref()),
            ("", Some("kgEA"))
        );
        // As the reference lists it (8.1.2: lower-case `null`).
        let reference = index_def(
            "ns=test:indexname=bk_by_n:set=bk:bin=n:type=numeric:indextype=default:context=null:exp=null:state=RW",
        )
        .expect("a bin index");
        assert_eq!((reference.bin.as_str(), reference.context), ("n", None));
        let expression = index_def(
            "ns=test:indexname=e:set=NULL:bin=NULL:type=numeric:indextype=default:context=NULL:exp=kwEC",
        );
        assert!(expression.expect_err("skipped").contains("expression"));
    }
}
