//! Every statistic of this node in the Prometheus text exposition format
//! (version 0.0.4), named as the aerospike-prometheus-exporter names them
//! (`shared/protocol/08-sc-xdr-ops.md` §5), so that dashboards made for
//! the exporter read a Citrine node directly; the server's HTTP endpoint
//! serves [`exposition`].
//!
//! Like the exporter, it reads the node's own info answers and turns each
//! `name=value` whose value is a number (or `true`/`false`, 1/0) into a
//! sample:
//! - `statistics` and `get-config:context=service` →
//!   `aerospike_node_stats_<name>{cluster_name,service}`;
//! - `namespace/<NS>` → `aerospike_namespace_<name>{cluster_name,ns,service,storage_engine}`;
//! - `sets` → `aerospike_sets_<name>{cluster_name,ns,service,set}`;
//! - `sindex-stat` of each index in `sindex-list:` →
//!   `aerospike_sindex_<name>{cluster_name,ns,service,sindex}`;
//! - `aerospike_node_up{build,cluster_name,node_id,service} 1`;
//! - the latency histograms ([`crate::latency`]) as real cumulative
//!   Prometheus histograms, `aerospike_latencies_<kind>_<unit>` with
//!   `_bucket{le=…}` (2^-10, 2^-9, … 1, 2, 4, … 65536 units and `+Inf`),
//!   `_sum` (in the unit) and `_count` — where the exporter can only
//!   publish the last interval's rates as gauges under the same series
//!   names (its `le` are 1 … 65536).
//!
//! A name's `.`, `-` and spaces become `_` (and anything else Prometheus
//! does not allow in a name, too). A configuration value (its name has a
//! `-`) or a level (in [`GAUGES`], [`CONTEXT_GAUGES`]) is a gauge; any
//! other statistic counts events, a counter — the exporter's rule. Checked
//! against the exporter itself (its v1.34.0 source, built here, scraping a
//! Citrine node, its `user-agents` query left out): the same
//! series names, label sets and types, less its own `aerospike_node_ticks`
//! and `pseudo_log_*`, plus the histograms' `_sum` and the histograms that
//! counted nothing yet.
//!
//! Invariants: every family is written once, its `# HELP` and `# TYPE`
//! lines first and its samples together; label values are escaped; a
//! histogram's buckets are cumulative and its `+Inf` bucket equals its
//! `_count`.

use crate::latency::{Histogram, COLUMNS, TICK_BITS};
use crate::Service;
use citrine_wire::info::InfoCommand;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Statistics that are levels, not counts of events, in any context (the
/// exporter's gauges among the names Citrine reports).
const GAUGES: &[&str] = &[
    "client_connections",
    "cluster_clock_skew_ms",
    "cluster_integrity",
    "cluster_is_member",
    "cluster_size",
    "data_total_bytes",
    "data_used_bytes",
    "data_used_pct",
    "device_data_bytes",
    "effective_replication_factor",
    "entries",
    "entries_per_bval",
    "entries_per_rec",
    "index_populating",
    "index_used_bytes",
    "load_pct",
    "load_time",
    "master_objects",
    "memory_data_bytes",
    "migrate_allowed",
    "migrate_partitions_remaining",
    "non_replica_objects",
    "ns_cluster_size",
    "objects",
    "prole_objects",
    "sindexes",
    "stop_writes",
    "tombstones",
    "truncate_lut",
    "truncating",
    "uptime",
    "used_bytes",
];

/// Gauges of one context only: (context, statistic). The exporter counts
/// the node's `migrate_*_partitions_remaining` as counters but a
/// namespace's as gauges.
const CONTEXT_GAUGES: &[(&str, &str)] = &[
    ("namespace", "migrate_rx_partitions_remaining"),
    ("namespace", "migrate_tx_partitions_remaining"),
    ("sindex", "query_basic_avg_rec_count"),
];

/// Identifiers that look like numbers only by chance (hexadecimal ids).
const NOT_FIGURES: &[&str] = &["cluster_key", "cluster_principal", "node-id"];

/// A metric family: its help, type and samples (`name{labels} value`).
struct Family {
    help: String,
    kind: &'static str,
    samples: Vec<String>,
}

/// The families of one exposition, written in name order.
#[derive(Default)]
struct Exposition {
    families: BTreeMap<String, Family>,
    /// Every series written (name and labels): a statistic an info answer
    /// names twice is written once, its first value.
    series: std::collections::HashSet<String>,
}

impl Exposition {
    /// Adds a sample of family `family` (created with `help` and `kind` the
    /// first time); `suffix` ends the sample's name (`_bucket`, or empty).
    fn add(
        &mut self,
        family: &str,
        (help, kind): (&str, &'static str),
        suffix: &str,
        labels: &[(&str, &str)],
        value: &str,
    ) {
        let series = format!("{family}{suffix}{}", label_set(labels));
        if !self.series.insert(series.clone()) {
            return;
        }
        let entry = self
            .families
            .entry(family.to_owned())
            .or_insert_with(|| Family {
                help: help.to_owned(),
                kind,
                samples: Vec::new(),
            });
        entry.samples.push(format!("{series} {value}"));
    }

    /// Adds every figure of an info answer's `name=value` pairs (split by
    /// `separator`) to `context`'s families with `labels`.
    fn add_pairs(&mut self, context: &str, answer: &str, separator: char, labels: &[(&str, &str)]) {
        for (name, value) in pairs(answer, separator) {
            let Some(value) = figure(name, value) else {
                continue;
            };
            let family = format!("aerospike_{context}_{}", metric_name(name));
            let help = name.replace(['_', '-', '.'], " ");
            self.add(&family, (&help, kind_of(context, name)), "", labels, &value);
        }
    }

    fn render(&self) -> String {
        let mut text = String::new();
        for (name, family) in &self.families {
            let _ = writeln!(text, "# HELP {name} {}", escape_help(&family.help));
            let _ = writeln!(text, "# TYPE {name} {}", family.kind);
            for sample in &family.samples {
                text.push_str(sample);
                text.push('\n');
            }
        }
        text
    }
}

/// The node's statistics in the text exposition format (see the module
/// doc).
pub fn exposition(service: &Service) -> String {
    let ask = |line: &str| crate::info::answer(service, &InfoCommand::parse(line));
    let cluster_name = service.config.cluster_name.clone();
    let address = service.config.access_address.clone();
    let node = [
        ("cluster_name", cluster_name.as_str()),
        ("service", address.as_str()),
    ];
    let mut out = Exposition::default();
    node_up(&mut out, service, &node);
    out.add_pairs("node_stats", &ask("get-config:context=service"), ';', &node);
    out.add_pairs("node_stats", &ask("statistics"), ';', &node);
    namespaces(&mut out, &ask, &node);
    sets(&mut out, &ask("sets"), &node);
    sindexes(&mut out, &ask, &node);
    latencies(&mut out, service, &node);
    out.render()
}

/// `aerospike_node_up`: 1 (the node answers).
fn node_up(out: &mut Exposition, service: &Service, node: &[(&str, &str); 2]) {
    let node_id = service.node_id.to_string();
    let labels = [
        ("build", crate::info::BUILD),
        node[0],
        ("node_id", node_id.as_str()),
        node[1],
    ];
    let help = ("Aerospike node active status", "gauge");
    out.add("aerospike_node_up", help, "", &labels, "1");
}

/// `aerospike_namespace_*` of every namespace, labelled with its storage
/// engine as the exporter does.
fn namespaces(out: &mut Exposition, ask: &dyn Fn(&str) -> String, node: &[(&str, &str); 2]) {
    for namespace in ask("namespaces").split(';').filter(|name| !name.is_empty()) {
        let answer = ask(&format!("namespace/{namespace}"));
        let engine = pairs(&answer, ';')
            .find(|(name, _)| *name == "storage-engine")
            .map(|(_, value)| value.to_owned());
        let mut labels = vec![node[0], ("ns", namespace), node[1]];
        if let Some(engine) = engine.as_deref() {
            labels.push(("storage_engine", engine));
        }
        out.add_pairs("namespace", &answer, ';', &labels);
    }
}

/// `aerospike_sets_*`: `sets` answers one `ns=…:set=…:name=value…` entry
/// per set.
fn sets(out: &mut Exposition, answer: &str, node: &[(&str, &str); 2]) {
    for entry in answer.split(';').filter(|entry| !entry.is_empty()) {
        let find = |wanted: &str| pairs(entry, ':').find(|(name, _)| *name == wanted);
        let (Some((_, namespace)), Some((_, set))) = (find("ns"), find("set")) else {
            continue;
        };
        let labels = [node[0], ("ns", namespace), node[1], ("set", set)];
        out.add_pairs("sets", entry, ':', &labels);
    }
}

/// `aerospike_sindex_*`: the `sindex-stat` of every index `sindex-list:`
/// names.
fn sindexes(out: &mut Exposition, ask: &dyn Fn(&str) -> String, node: &[(&str, &str); 2]) {
    let listing = ask("sindex-list:");
    for entry in listing.split(';').filter(|entry| !entry.is_empty()) {
        let find = |wanted: &str| pairs(entry, ':').find(|(name, _)| *name == wanted);
        let (Some((_, namespace)), Some((_, index))) = (find("ns"), find("indexname")) else {
            continue;
        };
        let answer = ask(&format!(
            "sindex-stat:namespace={namespace};indexname={index}"
        ));
        let labels = [node[0], ("ns", namespace), node[1], ("sindex", index)];
        out.add_pairs("sindex", &answer, ';', &labels);
    }
}

/// Every latency histogram as a cumulative Prometheus histogram.
fn latencies(out: &mut Exposition, service: &Service, node: &[(&str, &str); 2]) {
    let unit = service.latencies().unit();
    for histogram in service.latencies().histograms() {
        let family = format!(
            "aerospike_latencies_{}_{}",
            histogram.kind(),
            unit.metric_suffix()
        );
        let help = format!(
            "{} latency ({}), cumulative since the node started",
            histogram.kind().replace('_', " "),
            unit.metric_suffix()
        );
        add_histogram(out, &family, &help, histogram, unit.nanos(), node);
    }
}

/// One histogram's `_bucket`, `_sum` and `_count` samples.
fn add_histogram(
    out: &mut Exposition,
    family: &str,
    help: &str,
    histogram: &Histogram,
    unit_nanos: u64,
    node: &[(&str, &str); 2],
) {
    let snapshot = histogram.snapshot();
    let total = snapshot.total();
    let mut labels: Vec<(&str, &str)> = vec![node[0], node[1]];
    if let Some(namespace) = histogram.namespace() {
        labels.push(("ns", namespace));
    }
    let kind = (help, "histogram");
    let mut below = 0u64;
    for bucket in 0..TICK_BITS + COLUMNS {
        // Bucket `b` holds [2^(b-1), 2^b) ticks of 1/2^TICK_BITS unit.
        below += snapshot.counts[bucket];
        let le = format_float((1u64 << bucket) as f64 / (1u64 << TICK_BITS) as f64);
        let mut with_le = labels.clone();
        with_le.push(("le", &le));
        out.add(family, kind, "_bucket", &with_le, &below.to_string());
    }
    let mut with_le = labels.clone();
    with_le.push(("le", "+Inf"));
    out.add(family, kind, "_bucket", &with_le, &total.to_string());
    let sum = snapshot.sum_nanos as f64 / unit_nanos as f64;
    out.add(family, kind, "_sum", &labels, &format_float(sum));
    out.add(family, kind, "_count", &labels, &total.to_string());
}

/// The `name=value` pairs of an info answer split by `separator` (a pair
/// without `=` is skipped).
fn pairs(answer: &str, separator: char) -> impl Iterator<Item = (&str, &str)> {
    answer
        .split(separator)
        .filter_map(|pair| pair.split_once('='))
}

/// A statistic's value as a sample value: a number as it is, `true` and
/// `false` as 1 and 0 (the exporter's `TryConvert`); `None` for text.
fn figure(name: &str, value: &str) -> Option<String> {
    if NOT_FIGURES.contains(&name) {
        return None;
    }
    match value {
        "true" | "TRUE" | "True" | "t" | "T" => return Some("1".to_owned()),
        "false" | "FALSE" | "False" | "f" | "F" => return Some("0".to_owned()),
        _ => {}
    }
    let number: f64 = value.parse().ok()?;
    if !number.is_finite() {
        return None;
    }
    if value
        .bytes()
        .all(|byte| byte.is_ascii_digit() || byte == b'-')
    {
        // Integers keep every digit (an f64 would round past 2^53).
        return Some(value.to_owned());
    }
    Some(format_float(number))
}

/// A float sample value.
fn format_float(value: f64) -> String {
    if value.is_finite() {
        format!("{value}")
    } else {
        "NaN".to_owned()
    }
}

/// A statistic's name as a metric name: `.`, `-` and spaces (and any
/// other character Prometheus does not allow) become `_`.
fn metric_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A gauge for configuration values and levels, else a counter.
fn kind_of(context: &str, name: &str) -> &'static str {
    if name.contains('-') || GAUGES.contains(&name) || CONTEXT_GAUGES.contains(&(context, name)) {
        "gauge"
    } else {
        "counter"
    }
}

/// `{a="x",b="y"}` with the names in order and the values escaped.
fn label_set(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut sorted = labels.to_vec();
    sorted.sort_by(|left, right| left.0.cmp(right.0));
    let inner: Vec<String> = sorted
        .iter()
        .map(|(name, value)| format!("{name}=\"{}\"", escape_label(value)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// A label value escaped: backslash, double quote and newline.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A help text escaped: backslash and newline.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_numbers_and_booleans_only() {
        assert_eq!(figure("objects", "12").as_deref(), Some("12"));
        assert_eq!(figure("x", "-3").as_deref(), Some("-3"));
        assert_eq!(figure("x", "1.5").as_deref(), Some("1.5"));
        assert_eq!(figure("x", "true").as_deref(), Some("1"));
        assert_eq!(figure("x", "false").as_deref(), Some("0"));
        assert_eq!(figure("x", "memory"), None);
        assert_eq!(figure("x", "NaN"), None);
        assert_eq!(figure("cluster_key", "123456"), None);
        assert_eq!(
            figure("x", "18446744073709551615").as_deref(),
            Some("18446744073709551615")
        );
    }

    #[test]
    fn names_and_labels_follow_the_exporter_and_the_format() {
        assert_eq!(
            metric_name("storage-engine.file[0].used"),
            "storage_engine_file_0__used"
        );
        assert_eq!(kind_of("namespace", "default-ttl"), "gauge");
        assert_eq!(kind_of("namespace", "objects"), "gauge");
        assert_eq!(kind_of("namespace", "client_read_success"), "counter");
        let remaining = "migrate_tx_partitions_remaining";
        assert_eq!(kind_of("namespace", remaining), "gauge");
        assert_eq!(kind_of("node_stats", remaining), "counter");
        assert_eq!(
            label_set(&[("service", "a:1"), ("cluster_name", "c\"x\\")]),
            "{cluster_name=\"c\\\"x\\\\\",service=\"a:1\"}"
        );
    }

    #[test]
    fn families_are_written_once_with_their_samples_together() {
        let mut out = Exposition::default();
        out.add_pairs(
            "namespace",
            "objects=3;name=x;stop-writes-pct=90",
            ';',
            &[("ns", "a")],
        );
        out.add_pairs("namespace", "objects=4;objects=5", ';', &[("ns", "b")]);
        assert_eq!(
            out.render(),
            "# HELP aerospike_namespace_objects objects\n\
             # TYPE aerospike_namespace_objects gauge\n\
             aerospike_namespace_objects{ns=\"a\"} 3\n\
             aerospike_namespace_objects{ns=\"b\"} 4\n\
             # HELP aerospike_namespace_stop_writes_pct stop writes pct\n\
             # TYPE aerospike_namespace_stop_writes_pct gauge\n\
             aerospike_namespace_stop_writes_pct{ns=\"a\"} 90\n"
        );
    }
}
