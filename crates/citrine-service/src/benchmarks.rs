//! The reference's detail histograms, `enable-benchmarks-*`: per namespace
//! and per group (`read`, `write`, `udf`, `batch-sub`, `udf-sub`,
//! `ops-sub`), one histogram per stage of a request, named and ordered as
//! the reference names them (`{test}-read-start`, `{test}-write-master`,
//! …). `set-config:context=namespace;id=NS;enable-benchmarks-read=true`
//! turns a group on, `get-config:context=namespace` shows the flags, and
//! while a group is on the ticker logs its histograms as the reference's
//! `histogram dump:` lines ([`Benchmarks::dump`]). As in the reference
//! (8.1.2, asked), `latencies:` does not list them.
//!
//! The stages Citrine times for a single-record request or a batch row
//! (see [`crate::latency::Timed`]): `start`, from the request's arrival
//! (a batch row: from the row's start) to its namespace and kind being
//! known, for every request this node begins (one it then proxies too);
//! `local`/`master`, running it here (`batch-sub-read-local`,
//! `-write-master` or `-udf-master` by the row's kind); `dup-res`, from
//! routing to the end of duplicate resolution and the resolved run;
//! `repl-write`, from the master's run to every replica's
//! acknowledgement; `response`, from the last stage to the reply handed to
//! the connection. A batch row on a node alone (run by the batch itself,
//! not routed) counts only its run stage. `restart`, `repl-ping` and
//! `batch-sub-prestart` name stages Citrine does not have (no request
//! waits to restart; reads ping no replica; a row starts when its batch
//! is parsed). A background job's record write is a sub-transaction:
//! `udf-sub` (a UDF job) or `ops-sub` (an ops job), timed from the job's
//! sending it (`start`) through `master`, `repl-write` and `response`, as
//! the reference's are; like the reference, it counts in no `latencies:`
//! histogram ([`crate::latency::Op::in_latencies`]).
//!
//! Cost: off, a group costs one relaxed load of its flag per request
//! ([`Benchmarks::on`]) and two tests of the request's stage time; its
//! histograms are allocated the first time it is turned on
//! (bench/RESULTS.md has the instruction counts).
//!
//! Invariants: a histogram's counts only grow (turning a group off and on
//! keeps them, the dump shows the total since the first time it was on);
//! group and stage positions follow [`GROUPS`].

use crate::latency::{Histogram, Snapshot, Unit, BUCKETS, TICK_BITS};
use crate::storage_bench::StorageHistograms;
use crate::Layers;
use citrine_wire::info::InfoCommand;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A group of detail histograms, in [`GROUPS`] order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Read = 0,
    Write,
    Udf,
    BatchSub,
    UdfSub,
    OpsSub,
}

/// A stage of a request (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Start,
    DupRes,
    /// Run here: a read's `local`, a write's or UDF's `master`.
    Run,
    ReplWrite,
    Response,
}

impl Stage {
    /// The stage a request's fabric work ends: replica writes, or
    /// duplicate resolution (and the resolved run); none for a proxy.
    pub fn after(remote: &citrine_distribution::replication::Remote) -> Option<Stage> {
        use citrine_distribution::replication::Remote;
        match remote {
            Remote::Replicate { .. } => Some(Stage::ReplWrite),
            Remote::DupRes { .. } => Some(Stage::DupRes),
            Remote::Proxy { .. } => None,
        }
    }
}

/// Each group: its config name (`enable-benchmarks-NAME`) and its
/// histograms' name suffixes, in the reference's dump order.
pub const GROUPS: [(&str, &[&str]); 6] = [
    (
        "read",
        &[
            "read-start",
            "read-restart",
            "read-dup-res",
            "read-repl-ping",
            "read-local",
            "read-response",
        ],
    ),
    (
        "write",
        &[
            "write-start",
            "write-restart",
            "write-dup-res",
            "write-master",
            "write-repl-write",
            "write-response",
        ],
    ),
    (
        "udf",
        &[
            "udf-start",
            "udf-restart",
            "udf-dup-res",
            "udf-master",
            "udf-repl-write",
            "udf-response",
        ],
    ),
    (
        "batch-sub",
        &[
            "batch-sub-prestart",
            "batch-sub-start",
            "batch-sub-restart",
            "batch-sub-dup-res",
            "batch-sub-repl-ping",
            "batch-sub-read-local",
            "batch-sub-write-master",
            "batch-sub-udf-master",
            "batch-sub-repl-write",
            "batch-sub-response",
        ],
    ),
    (
        "udf-sub",
        &[
            "udf-sub-start",
            "udf-sub-restart",
            "udf-sub-dup-res",
            "udf-sub-master",
            "udf-sub-repl-write",
            "udf-sub-response",
        ],
    ),
    (
        "ops-sub",
        &[
            "ops-sub-start",
            "ops-sub-restart",
            "ops-sub-dup-res",
            "ops-sub-master",
            "ops-sub-repl-write",
            "ops-sub-response",
        ],
    ),
];

/// The position (in [`GROUPS`]) of the histogram a stage of a group
/// counts in; `op` picks a batch row's run stage (`read`, `write`, `udf`).
/// A table, not a name search: it runs on every request of a group that
/// is on (`stage_positions_name_their_stages` checks it against the names).
#[inline]
fn stage_position(group: Group, stage: Stage, op: Group) -> Option<usize> {
    match (group, stage) {
        (Group::Read, Stage::Start) | (Group::Write | Group::Udf, Stage::Start) => Some(0),
        (Group::UdfSub | Group::OpsSub, Stage::Start) => Some(0),
        (Group::BatchSub, Stage::Start) => Some(1),
        (Group::BatchSub, Stage::DupRes) => Some(3),
        (_, Stage::DupRes) => Some(2),
        (Group::Read, Stage::Run) => Some(4),
        (Group::Read, Stage::ReplWrite) => None,
        (Group::BatchSub, Stage::Run) => Some(match op {
            Group::Write => 6,
            Group::Udf => 7,
            _ => 5,
        }),
        (Group::BatchSub, Stage::ReplWrite) => Some(8),
        (Group::BatchSub, Stage::Response) => Some(9),
        (_, Stage::Run) => Some(3),
        (_, Stage::ReplWrite) => Some(4),
        (_, Stage::Response) => Some(5),
    }
}

/// One namespace's flags and (once first on) histograms.
struct NamespaceBenchmarks {
    name: String,
    on: [AtomicBool; GROUPS.len()],
    histograms: [OnceLock<Box<[Histogram]>>; GROUPS.len()],
    /// `enable-benchmarks-storage` ([`crate::storage_bench`]).
    storage_on: AtomicBool,
    storage: OnceLock<Arc<StorageHistograms>>,
}

/// Every namespace's detail histograms (see the module doc).
pub struct Benchmarks {
    namespaces: Vec<NamespaceBenchmarks>,
}

impl std::fmt::Debug for Benchmarks {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Benchmarks")
    }
}

impl Benchmarks {
    /// Every group off, for these namespaces (configuration order).
    pub fn new<'n>(namespaces: impl IntoIterator<Item = &'n str>) -> Benchmarks {
        Benchmarks {
            namespaces: namespaces
                .into_iter()
                .map(|name| NamespaceBenchmarks {
                    name: name.to_owned(),
                    on: std::array::from_fn(|_| AtomicBool::new(false)),
                    histograms: std::array::from_fn(|_| OnceLock::new()),
                    storage_on: AtomicBool::new(false),
                    storage: OnceLock::new(),
                })
                .collect(),
        }
    }

    /// Whether `group` is on in the namespace at `namespace`: one relaxed
    /// load, the whole cost of a group that is off.
    #[inline]
    pub fn on(&self, namespace: usize, group: Group) -> bool {
        self.namespaces
            .get(namespace)
            .is_some_and(|ns| ns.on[group as usize].load(Ordering::Relaxed))
    }

    /// Turns `group` on or off in the namespace at `namespace`.
    pub fn set(&self, namespace: usize, group: Group, on: bool) {
        let Some(ns) = self.namespaces.get(namespace) else {
            return;
        };
        if on {
            ns.histograms[group as usize].get_or_init(|| {
                GROUPS[group as usize]
                    .1
                    .iter()
                    .map(|suffix| {
                        Histogram::new(
                            format!("{{{}}}-{suffix}", ns.name),
                            Some(ns.name.clone()),
                            "benchmark",
                        )
                    })
                    .collect()
            });
        }
        ns.on[group as usize].store(on, Ordering::Relaxed);
    }

    /// The storage histograms of the namespace at `namespace`, made by
    /// `make` the first time.
    pub(crate) fn storage(
        &self,
        namespace: usize,
        make: impl FnOnce() -> Arc<StorageHistograms>,
    ) -> Option<Arc<StorageHistograms>> {
        let ns = self.namespaces.get(namespace)?;
        Some(ns.storage.get_or_init(make).clone())
    }

    /// Whether the ticker dumps the namespace's storage histograms.
    pub(crate) fn set_storage(&self, namespace: usize, on: bool) {
        if let Some(ns) = self.namespaces.get(namespace) {
            ns.storage_on.store(on, Ordering::Relaxed);
        }
    }

    /// Counts `elapsed` in `stage` of `group` (`op`: a batch row's kind).
    pub fn record(
        &self,
        namespace: usize,
        (group, op): (Group, Group),
        stage: Stage,
        elapsed: Duration,
        unit_nanos: u64,
    ) {
        let Some(ns) = self.namespaces.get(namespace) else {
            return;
        };
        let Some(histograms) = ns.histograms[group as usize].get() else {
            return;
        };
        let position = stage_position(group, stage, op);
        if let Some(histogram) = position.and_then(|position| histograms.get(position)) {
            histogram.record_in(elapsed, unit_nanos);
        }
    }

    /// `get-config:context=namespace` pairs: `enable-benchmarks-NAME`, in
    /// name order as the reference lists them.
    pub fn config_pairs(&self, namespace: usize) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = GROUPS
            .iter()
            .enumerate()
            .map(|(group, (name, _))| {
                let on = self
                    .namespaces
                    .get(namespace)
                    .is_some_and(|ns| ns.on[group].load(Ordering::Relaxed));
                (format!("enable-benchmarks-{name}"), on.to_string())
            })
            .collect();
        pairs.sort();
        pairs
    }

    /// The ticker's log lines for every group that is on: per histogram
    /// `histogram dump: NAME (TOTAL total) UNIT`, then its non-empty
    /// buckets four to a line, ` (BB: COUNT)` — bucket 0 below one unit,
    /// bucket `b` in `[2^(b-1), 2^b)` units, as the reference logs them.
    pub fn dump(&self, unit: Unit) -> Vec<String> {
        let mut lines = Vec::new();
        for ns in &self.namespaces {
            for (group, histograms) in ns.histograms.iter().enumerate() {
                let (Some(histograms), true) =
                    (histograms.get(), ns.on[group].load(Ordering::Relaxed))
                else {
                    continue;
                };
                for histogram in histograms.iter() {
                    let unit = unit.info_name();
                    lines.extend(dump_lines(histogram.name(), &histogram.snapshot(), unit));
                }
            }
            if let (Some(storage), true) = (ns.storage.get(), ns.storage_on.load(Ordering::Relaxed))
            {
                for (histogram, bytes) in storage.histograms() {
                    let unit_name = if bytes { "bytes" } else { unit.info_name() };
                    lines.extend(dump_lines(
                        histogram.name(),
                        &histogram.snapshot(),
                        unit_name,
                    ));
                }
            }
        }
        lines
    }
}

/// One histogram's dump lines (see [`Benchmarks::dump`]), its counts in
/// `unit` (`msec`, `usec`, `bytes`).
fn dump_lines(name: &str, snapshot: &Snapshot, unit: &str) -> Vec<String> {
    let mut buckets = [0u64; BUCKETS];
    for (bucket, count) in snapshot.counts.iter().enumerate() {
        buckets[bucket.saturating_sub(TICK_BITS)] += count;
    }
    let mut lines = vec![format!(
        "histogram dump: {name} ({} total) {unit}",
        snapshot.total(),
    )];
    let entries: Vec<String> = buckets
        .iter()
        .enumerate()
        .filter(|(_, count)| **count > 0)
        .map(|(bucket, count)| format!("({bucket:02}: {count:010})"))
        .collect();
    for chunk in entries.chunks(4) {
        lines.push(format!(" {}", chunk.join(" ")));
    }
    lines
}

/// `set-config:context=namespace;id=NS;enable-benchmarks-NAME=true|false`
/// (every other parameter but `context` and `id` refused): the
/// reference's answers — `ERROR:20:namespace not found on node` for an
/// unknown namespace, `ERROR:4:invalid set-config parameter` for a value
/// that is neither `true` nor `false` or an unknown group.
pub(crate) fn set_config(layers: &Layers<'_>, command: &InfoCommand<'_>) -> String {
    let Some(index) = command
        .param("id")
        .and_then(|name| layers.data.namespace_index(name.as_bytes()))
    else {
        return "ERROR:20:namespace not found on node".to_owned();
    };
    let mut changes = Vec::new();
    for (name, value) in &command.params {
        if matches!(*name, "context" | "id") {
            continue;
        }
        let group = name.strip_prefix("enable-benchmarks-").and_then(|group| {
            // `storage` is the last, after the request groups.
            let storage = (group == "storage").then_some(GROUPS.len());
            GROUPS
                .iter()
                .position(|(known, _)| *known == group)
                .or(storage)
        });
        let on = match *value {
            "true" => true,
            "false" => false,
            _ => return "ERROR:4:invalid set-config parameter".to_owned(),
        };
        match group {
            Some(group) => changes.push((group, on)),
            None => return "ERROR:4:invalid set-config parameter".to_owned(),
        }
    }
    for (group, on) in changes {
        if group == GROUPS.len() {
            crate::storage_bench::set(layers, index, on);
            tracing::info!(
                namespace = index,
                group = "storage",
                on,
                "enable-benchmarks changed"
            );
            continue;
        }
        let group = [
            Group::Read,
            Group::Write,
            Group::Udf,
            Group::BatchSub,
            Group::UdfSub,
            Group::OpsSub,
        ][group];
        layers.latencies.benchmarks().set(index, group, on);
        tracing::info!(
            namespace = index,
            group = GROUPS[group as usize].0,
            on,
            "enable-benchmarks changed"
        );
    }
    "ok".to_owned()
}

/// Whether a `set-config` names a benchmark flag.
pub(crate) fn names_benchmarks(command: &InfoCommand<'_>) -> bool {
    command
        .params
        .iter()
        .any(|(name, _)| name.starts_with("enable-benchmarks-"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stages_name_the_reference_histograms() {
        let benchmarks = Benchmarks::new(["test"]);
        assert!(!benchmarks.on(0, Group::Read));
        benchmarks.set(0, Group::Read, true);
        benchmarks.set(0, Group::BatchSub, true);
        let unit = Unit::Milliseconds.nanos();
        let one = |group, op, stage, ms| {
            benchmarks.record(0, (group, op), stage, Duration::from_millis(ms), unit)
        };
        one(Group::Read, Group::Read, Stage::Start, 0);
        one(Group::Read, Group::Read, Stage::Run, 3);
        one(Group::Read, Group::Read, Stage::Run, 3);
        one(Group::BatchSub, Group::Write, Stage::Run, 0);
        // Off groups have no histograms: nothing counted, nothing dumped.
        one(Group::Write, Group::Write, Stage::Run, 0);
        let dump = benchmarks.dump(Unit::Milliseconds);
        assert_eq!(dump[0], "histogram dump: {test}-read-start (1 total) msec");
        assert_eq!(dump[1], " (00: 0000000001)");
        let local = dump
            .iter()
            .position(|line| line.contains("{test}-read-local"))
            .unwrap();
        assert_eq!(
            dump[local],
            "histogram dump: {test}-read-local (2 total) msec"
        );
        assert_eq!(dump[local + 1], " (02: 0000000002)");
        assert!(dump
            .contains(&"histogram dump: {test}-batch-sub-write-master (1 total) msec".to_owned()));
        assert!(dump.contains(&"histogram dump: {test}-read-restart (0 total) msec".to_owned()));
        assert!(!dump
            .iter()
            .any(|line| line.contains("-write-") && !line.contains("batch-sub")));
        assert_eq!(
            dump.iter()
                .filter(|line| line.starts_with("histogram dump"))
                .count(),
            16
        );
        benchmarks.set(0, Group::Read, false);
        assert_eq!(
            benchmarks
                .dump(Unit::Milliseconds)
                .iter()
                .filter(|line| line.starts_with("histogram dump"))
                .count(),
            10
        );
    }

    #[test]
    fn stage_positions_name_their_stages() {
        let groups = [
            Group::Read,
            Group::Write,
            Group::Udf,
            Group::BatchSub,
            Group::UdfSub,
            Group::OpsSub,
        ];
        let stages = [
            (Stage::Start, "-start"),
            (Stage::DupRes, "-dup-res"),
            (Stage::ReplWrite, "-repl-write"),
            (Stage::Response, "-response"),
        ];
        for group in groups {
            let names = GROUPS[group as usize].1;
            for (stage, ending) in stages {
                match stage_position(group, stage, group) {
                    Some(at) => assert!(
                        format!("-{}", names[at]).ends_with(ending),
                        "{group:?} {stage:?}"
                    ),
                    None => assert!(!names.iter().any(|name| name.ends_with(ending))),
                }
            }
            for op in [Group::Read, Group::Write, Group::Udf] {
                let run = names[stage_position(group, Stage::Run, op).unwrap()];
                let expected = match (group, op) {
                    (Group::BatchSub, Group::Write) => "batch-sub-write-master",
                    (Group::BatchSub, Group::Udf) => "batch-sub-udf-master",
                    (Group::BatchSub, _) => "batch-sub-read-local",
                    (Group::Read, _) => "read-local",
                    _ => "master",
                };
                assert!(run.ends_with(expected), "{group:?} {op:?}: {run}");
            }
        }
    }

    #[test]
    fn buckets_are_dumped_four_to_a_line() {
        let mut snapshot = Snapshot::default();
        for bucket in [
            0,
            TICK_BITS,
            TICK_BITS + 1,
            TICK_BITS + 2,
            TICK_BITS + 3,
            TICK_BITS + 4,
        ] {
            snapshot.counts[bucket] = 1;
        }
        let lines = dump_lines(
            "{t}-write-master",
            &snapshot,
            Unit::Microseconds.info_name(),
        );
        assert_eq!(
            lines,
            [
                "histogram dump: {t}-write-master (6 total) usec",
                " (00: 0000000002) (01: 0000000001) (02: 0000000001) (03: 0000000001)",
                " (04: 0000000001)"
            ]
        );
    }

    #[test]
    fn config_pairs_are_in_the_reference_order() {
        let benchmarks = Benchmarks::new(["test"]);
        benchmarks.set(0, Group::UdfSub, true);
        let names: Vec<String> = benchmarks
            .config_pairs(0)
            .into_iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        assert_eq!(
            names,
            [
                "enable-benchmarks-batch-sub=false",
                "enable-benchmarks-ops-sub=false",
                "enable-benchmarks-read=false",
                "enable-benchmarks-udf=false",
                "enable-benchmarks-udf-sub=true",
                "enable-benchmarks-write=false"
            ]
        );
    }
}
