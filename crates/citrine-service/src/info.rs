//! Info commands (proto type 1): identity, capabilities, generations, peers,
//! the partition map (`replicas`), namespaces, statistics, sets,
//! configuration, truncation — with the exact answer formats of
//! `shared/protocol/03-info.md`.
//!
//! Invariant: every request line gets exactly one answer line that echoes the
//! line byte for byte; unknown commands answer `ERROR:4:unrecognized command`;
//! `help` lists the known ones (`COMMANDS`, kept true by a test that asks
//! each).
//!
//! Only the dispatcher (`answer`) sees the `Service`: it routes each command
//! to the handle its answer needs — the two layers (`Layers`: the view, the
//! partition map, namespaces, statistics, `set-config`), the index feature
//! (`sindex::Indexes`, also for `sets`), the UDF modules, the jobs,
//! truncation — and `get-config`, which reports every feature's settings.

use crate::cluster_state::NamespaceMap;
use crate::config::StorageEngineConfig;
use crate::namespace::{Namespace, NamespaceStats};
use crate::smd::Store;
use crate::{Layers, Service};
use citrine_types::PARTITIONS;
use citrine_wire::info::{request_lines, InfoCommand, InfoResponse};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// The server version we announce. Clients gate features on it (03-info §3.3).
pub const BUILD: &str = "8.1.2.0";
/// The edition string.
pub const EDITION: &str = "Citrine";
/// Capabilities, as the reference 8.1 server lists them.
pub const FEATURES: &str = "batch-any;batch-index;blob-bits;cdt-index;cdt-list;cdt-map;cluster-stable;float;geo;sindex-exists;peers;pipelining;pquery;pscans;query-show;relaxed-sc;replicas;replicas-all;replicas-master;replicas-max;truncate-namespace;udf";
/// The namespace a command names (`namespace=` or `ns=`), checked as the
/// reference checks it: missing, empty, or longer than a namespace name
/// can be answers `ERROR:20:...` (the text to answer is the error).
pub(crate) fn namespace_name<'a>(command: &InfoCommand<'a>) -> Result<&'a str, String> {
    let key = if command.param("namespace").is_none() && command.param("ns").is_some() {
        "ns"
    } else {
        "namespace"
    };
    namespace_under(command, key)
}

/// The namespace a command names under `key` alone, checked as
/// [`namespace_name`] checks it (the truncation commands take no `ns=`).
pub(crate) fn namespace_under<'a>(command: &InfoCommand<'a>, key: &str) -> Result<&'a str, String> {
    match command.required(key) {
        Err(_) if command.param(key).is_none() => Err("ERROR:20:missing 'namespace'".to_owned()),
        Err(_) => Err("ERROR:20:missing 'namespace' value".to_owned()),
        Ok(name) if name.len() > citrine_types::NAMESPACE_NAME_MAX => {
            Err("ERROR:20:'namespace' value too long".to_owned())
        }
        Ok(name) => Ok(name),
    }
}

/// The set a command must name: missing or empty (never "every set"), or
/// longer than a set name can be, answers `ERROR:4:...`.
pub(crate) fn set_name<'a>(command: &InfoCommand<'a>) -> Result<&'a str, String> {
    match command.required("set") {
        Err(message) => Err(format!("ERROR:4:{message}")),
        Ok(set) if set.len() > citrine_types::SET_NAME_MAX => {
            Err("ERROR:4:'set' value too long".to_owned())
        }
        Ok(set) => Ok(set),
    }
}

/// Answers every command line of an info request.
pub fn handle(service: &Service, body: &[u8], out: &mut Vec<u8>) {
    answer_request(service, body, out, None);
}

/// Answers every command line of an info request; returns the shared
/// stores its commands changed (each once), which the other members must
/// acknowledge before the answer goes out (see [`crate::smd`]).
pub(crate) fn answer_request(
    service: &Service,
    body: &[u8],
    out: &mut Vec<u8>,
    mut session: Option<&mut crate::session::Session>,
) -> Vec<Store> {
    let lines = request_lines(body);
    let mut changed = Vec::new();
    let mut response = InfoResponse::new();
    if lines.is_empty() {
        for name in [
            "features",
            "node",
            "edition",
            "build",
            "version",
            "statistics",
            "services",
            "services-alumni",
            "partition-generation",
        ] {
            response.push(name, &answer(service, &InfoCommand::parse(name)));
        }
    }
    for line in &lines {
        let command = InfoCommand::parse(line);
        let answer = match (command.name, session.as_deref_mut()) {
            ("user-agent-set", Some(session)) => {
                service.user_agents.set(session, command.param("value"))
            }
            _ => answer(service, &command),
        };
        if let Some(store) = Store::changed_by(command.name) {
            if answer == "ok" && !changed.contains(&store) {
                changed.push(store);
            }
        }
        response.push(line, &answer);
    }
    response.write_frame(out);
    changed
}

/// `rack-ids`: this node's rack in every namespace, `ns:rack;ns:rack`
/// (the rack it joined its view with; its configured rack before its first
/// view). The reference answers it only in its Enterprise edition;
/// rack-aware clients (the C client with `rack_aware`, Go's `RackAware`,
/// Citrine's `PreferRack`) ask it with
/// `rebalance-generation` to read from a replica on their own rack. With
/// the error answer they learn no rack and read from the master.
fn rack_ids(layers: &Layers<'_>) -> String {
    let cluster = layers.cluster();
    let rack = cluster
        .members
        .iter()
        .find(|member| member.node_id == layers.node_id())
        .map_or(0, |member| member.rack_id);
    layers
        .namespaces()
        .map(|namespace| format!("{}:{rack}", namespace.config.name))
        .collect::<Vec<_>>()
        .join(";")
}

/// `racks:` (optionally `racks:namespace=NS`): per namespace, the nodes of
/// the current view grouped by rack, racks ascending and nodes ascending
/// within a rack, as `ns=NS:rack_ID=NODE,NODE:rack_ID=NODE`; namespaces
/// separated by `;`. Every node joins with one rack for all its namespaces,
/// so each namespace lists the same racks. Before its first view a node
/// lists itself alone, in its configured rack.
fn racks(layers: &Layers<'_>, command: &InfoCommand<'_>) -> String {
    let wanted = command.param("namespace").or_else(|| command.param("ns"));
    if let Some(name) = wanted {
        if layers.namespace(name.as_bytes()).is_none() {
            return "ERROR:4:namespace not found".to_owned();
        }
    }
    let cluster = layers.cluster();
    debug_assert!(
        cluster.members.is_sorted_by_key(|member| member.node_id),
        "a view's members are in node-id order"
    );
    let mut by_rack: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
    for member in &cluster.members {
        by_rack
            .entry(member.rack_id)
            .or_default()
            .push(member.node_id.to_string());
    }
    let racks = by_rack
        .into_iter()
        .map(|(rack, nodes)| format!("rack_{rack}={}", nodes.join(",")))
        .collect::<Vec<_>>()
        .join(":");
    layers
        .namespaces()
        .map(|namespace| namespace.config.name.as_str())
        .filter(|name| wanted.is_none_or(|wanted| wanted == *name))
        .map(|name| format!("ns={name}:{racks}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// The cluster key, as upper-case hex.
pub fn cluster_key(layers: &Layers<'_>) -> String {
    format!("{:X}", layers.cluster().cluster_key)
}

/// The info commands this server answers, in order: what `help` lists.
pub(crate) const COMMANDS: &[&str] = &[
    "alumni-clear-alt",
    "alumni-clear-std",
    "alumni-tls-alt",
    "alumni-tls-std",
    "build",
    "cluster-info",
    "cluster-key",
    "cluster-name",
    "cluster-size",
    "cluster-stable",
    "compatibility-id",
    "edition",
    "features",
    "get-config",
    "get-stats",
    "help",
    "latencies",
    "logs",
    "namespace",
    "namespaces",
    "node",
    "partition-checksums",
    "partition-generation",
    "partitions",
    "peers-clear-alt",
    "peers-clear-std",
    "peers-generation",
    "peers-tls-alt",
    "peers-tls-std",
    "query-abort",
    "query-abort-all",
    "query-show",
    "rack-ids",
    "racks",
    "rebalance-generation",
    "recluster",
    "release",
    "replicas",
    "replicas-all",
    "replicas-master",
    "revive",
    "roster",
    "roster-set",
    "service",
    "service-clear-alt",
    "service-clear-std",
    "service-tls-alt",
    "service-tls-std",
    "services",
    "services-alternate",
    "services-alumni",
    "services-alumni-reset",
    "set-config",
    "sets",
    "sindex",
    "sindex-create",
    "sindex-delete",
    "sindex-exists",
    "sindex-list",
    "sindex-stat",
    "statistics",
    "status",
    "truncate",
    "truncate-namespace",
    "truncate-namespace-undo",
    "truncate-undo",
    "udf-get",
    "udf-list",
    "udf-put",
    "udf-remove",
    "user-agent-set",
    "user-agents",
    "version",
];

/// `peers-tls-std`: `<gen>,<default port>,[[id,tls-name,[addr]],...]` over
/// the other members with a TLS port (they say theirs in their fabric
/// hello), the default port being this node's TLS port (3000 without one,
/// as the clear list's).
fn tls_peers(layers: &Layers<'_>) -> String {
    let port = layers
        .config
        .tls_access_address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse::<u16>().ok())
        .unwrap_or(3000);
    layers.cluster().peers_tls_value(port)
}

/// The answer to one info command, from the family of commands it
/// belongs to (each family's answers take the handles they need).
pub(crate) fn answer(service: &Service, command: &InfoCommand<'_>) -> String {
    let layers = service.layers();
    about_node(&layers, command)
        .or_else(|| about_cluster(&layers, command))
        .or_else(|| about_data(service, command))
        .or_else(|| about_features(service, command))
        .unwrap_or_else(|| "ERROR:4:unrecognized command".to_owned())
}

/// The node's identity and build; `None` for another command.
fn about_node(layers: &Layers<'_>, command: &InfoCommand<'_>) -> Option<String> {
    Some(match command.name {
        "help" => COMMANDS.join(";"),
        "node" => layers.node_id().to_string(),
        "build" => BUILD.to_owned(),
        "edition" => EDITION.to_owned(),
        "version" => format!("{EDITION} build {BUILD}"),
        "release" => format!(
            "edition={EDITION};version={BUILD};os=linux;arch={};sha=citrine",
            std::env::consts::ARCH
        ),
        "compatibility-id" => "1".to_owned(),
        "features" => FEATURES.to_owned(),
        "cluster-name" => layers.config.cluster_name.clone(),
        "status" => "ok".to_owned(),
        "logs" => "0:stderr".to_owned(),
        _ => return None,
    })
}

/// The cluster as this node sees it: generations, peers and services,
/// partitions and replicas, racks; `None` for another command.
fn about_cluster(layers: &Layers<'_>, command: &InfoCommand<'_>) -> Option<String> {
    Some(match command.name {
        "partition-generation" => partition_generation(layers).to_string(),
        "peers-generation" => layers.cluster().peers_generation.to_string(),
        "rebalance-generation" => layers.cluster().partition_generation.to_string(),
        "peers-clear-std" | "peers-clear-alt" => layers.cluster().peers_value(),
        "peers-tls-std" | "peers-tls-alt" => tls_peers(layers),
        "alumni-clear-std" | "alumni-clear-alt" | "alumni-tls-std" | "alumni-tls-alt" => {
            format!("{},3000,[]", layers.cluster().peers_generation)
        }
        "services" | "services-alternate" => layers.cluster().services_value(),
        "services-alumni" | "services-alumni-reset" => String::new(),
        "service" | "service-clear-std" => layers.config.access_address.clone(),
        "service-tls-std" => layers.config.tls_access_address.clone(),
        // No alternate access addresses.
        "service-clear-alt" | "service-tls-alt" => String::new(),
        "partitions" => PARTITIONS.to_string(),
        "replicas" => replicas(layers, true),
        "replicas-all" => replicas(layers, false),
        "replicas-master" => replicas_master(layers),
        "cluster-stable" => cluster_stable(layers, command),
        "cluster-key" => cluster_key(layers),
        "cluster-size" => layers.cluster().size().to_string(),
        "cluster-info" => cluster_info(layers),
        "rack-ids" => rack_ids(layers),
        "racks" => racks(layers, command),
        "partition-checksums" => partition_checksums(layers, command),
        _ => return None,
    })
}

/// `replicas-master`: per namespace, the bitmap of the partitions this
/// node masters (none while it is in no cluster view).
fn replicas_master(layers: &Layers<'_>) -> String {
    let orphan = layers.is_orphan();
    let cluster = layers.cluster();
    cluster
        .namespaces
        .iter()
        .map(|namespace| {
            if orphan {
                format!(
                    "{}:{}",
                    namespace.name,
                    crate::cluster_state::bitmap_base64(std::iter::empty())
                )
            } else {
                format!("{}:{}", namespace.name, master_bitmap(layers, namespace))
            }
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// The node's data and settings: namespaces, sets, statistics,
/// configuration, latencies, client agents, truncation and the roster;
/// `None` for another command.
fn about_data(service: &Service, command: &InfoCommand<'_>) -> Option<String> {
    let layers = service.layers();
    Some(match command.name {
        "namespaces" => layers
            .namespaces()
            .map(|namespace| namespace.config.name.as_str())
            .collect::<Vec<_>>()
            .join(";"),
        "namespace" => match command
            .positional
            .first()
            .and_then(|name| layers.namespace(name.as_bytes()))
        {
            Some(namespace) => namespace_info(&layers, namespace),
            None => "type=unknown".to_owned(),
        },
        "statistics" => statistics(service),
        "sets" => sets(&service.indexes(), command),
        "set-config" | "get-config" if command.param("context") == Some("xdr") => {
            xdr(service, command)
        }
        "get-config" => get_config(service, command),
        "get-stats" => xdr(service, command),
        "xdr-set-filter" => match service.xdr() {
            Some(xdr) => xdr.set_filter(&command.params),
            None => "ERROR:4:xdr is not running".to_owned(),
        },
        "xdr-get-filter" => match service.xdr() {
            Some(xdr) => xdr.get_filter(&command.params),
            None => "ERROR:4:xdr is not running".to_owned(),
        },
        "set-config" if command.param("context") == Some("security") => {
            set_security_config(service, command)
        }
        "set-config" => set_config(&layers, &service.client_limits, command),
        // Without a connection (a tool's or a test's request): nothing kept.
        "user-agent-set" => "ok".to_owned(),
        "user-agents" => service.user_agents.text(),
        "latencies" => layers.latencies.info(command),
        "truncate" => service.truncate_command(command, false),
        "truncate-namespace" => service.truncate_command(command, true),
        "truncate-undo" => service.truncate_undo_command(command, false),
        "truncate-namespace-undo" => service.truncate_undo_command(command, true),
        "roster" | "roster-set" | "recluster" | "revive" => crate::sc::answer(service, command),
        _ => return None,
    })
}

/// The features' commands: UDF modules, jobs, secondary indexes; `None`
/// for another command.
fn about_features(service: &Service, command: &InfoCommand<'_>) -> Option<String> {
    let indexes = || service.indexes();
    Some(match command.name {
        "udf-put" => crate::udf::put(&service.udf_modules(), command),
        "udf-get" => crate::udf::get(&service.udf_modules(), command),
        "udf-remove" => crate::udf::remove(&service.udf_modules(), command),
        "udf-list" => crate::udf::list(&service.udf_modules()),
        "query-show" => crate::job::show(&service.jobs, service.layers(), command),
        "query-abort" => crate::job::abort(&service.jobs, command),
        "query-abort-all" => crate::job::abort_all(&service.jobs),
        "sindex-create" => crate::sindex::smd::create(&indexes(), command),
        "sindex-delete" => crate::sindex::smd::delete(&indexes(), command),
        "sindex-exists" => crate::sindex::exists(&indexes(), command),
        "sindex" => match command.positional.as_slice() {
            [] => crate::sindex::list(&indexes(), None, "", false),
            [namespace, ..] if service.namespace(namespace.as_bytes()).is_none() => {
                "ns_type=unknown".to_owned()
            }
            [namespace] => crate::sindex::list(&indexes(), Some(namespace), "", false),
            [namespace, name, ..] => crate::sindex::stat(&indexes(), namespace, name),
        },
        "sindex-list" => crate::sindex::list(
            &indexes(),
            command.param("ns").or_else(|| command.param("namespace")),
            "ERROR:20:namespace not found on node",
            command.param("b64") == Some("true"),
        ),
        "sindex-stat" => crate::sindex::stat_command(&indexes(), command),
        _ => return None,
    })
}

/// `replicas` (with the AP regime 0) and `replicas-all`: per namespace, one
/// bitmap per column (master, then replicas) of the partitions this node
/// holds; the number of columns is the effective replication factor.
fn replicas(layers: &Layers<'_>, with_regime: bool) -> String {
    let cluster = layers.cluster();
    let orphan = layers.is_orphan();
    cluster
        .namespaces
        .iter()
        .map(|namespace| {
            if let Some((regime, columns)) = crate::sc::columns(layers, namespace) {
                let width = columns.len();
                let columns = columns.join(",");
                return match with_regime {
                    true => format!("{}:{regime},{width},{columns}", namespace.name),
                    false => format!("{}:{width},{columns}", namespace.name),
                };
            }
            let columns = if orphan {
                // Not in a cluster yet: it holds nothing.
                vec![
                    crate::cluster_state::bitmap_base64(std::iter::empty());
                    namespace.column_bitmaps.len()
                ]
                .join(",")
            } else {
                let mut columns = namespace.column_bitmaps.clone();
                if let Some(first) = columns.first_mut() {
                    if let Cow::Owned(claimed) = master_bitmap(layers, namespace) {
                        *first = claimed;
                    }
                }
                columns.join(",")
            };
            if with_regime {
                format!(
                    "{}:0,{},{columns}",
                    namespace.name,
                    namespace.column_bitmaps.len()
                )
            } else {
                format!(
                    "{}:{},{columns}",
                    namespace.name,
                    namespace.column_bitmaps.len()
                )
            }
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// `partition-generation`: the view's, plus every change of this node's
/// master-column claims within the view (acting masters), so a client
/// fetches `replicas` again whenever the answer would differ.
fn partition_generation(layers: &Layers<'_>) -> u64 {
    layers.cluster().partition_generation + layers.migrations().claims_generation()
}

/// This node's master-column bitmap of a namespace: the partition map's,
/// less the partitions it cedes to acting masters while it fills them,
/// plus those it claims as an acting master (see `crate::migration`).
fn master_bitmap<'a>(layers: &Layers<'_>, namespace: &'a NamespaceMap) -> Cow<'a, str> {
    if let Some((_, columns)) = crate::sc::columns(layers, namespace) {
        // Strong consistency: the view's working masters.
        return Cow::Owned(columns.into_iter().next().unwrap_or_default());
    }
    let fixed = namespace.column_bitmaps.first().map_or("", String::as_str);
    let (ceded, taken) = layers
        .migrations()
        .claim_overrides(&namespace.name, layers.node_id());
    if ceded.is_empty() && taken.is_empty() {
        return Cow::Borrowed(fixed);
    }
    let mastered = namespace
        .map
        .columns_of(layers.node_id())
        .filter(|(partition, column)| *column == 0 && ceded.binary_search(partition).is_err())
        .map(|(partition, _)| partition);
    Cow::Owned(crate::cluster_state::bitmap_base64(
        mastered.chain(taken.iter().copied()),
    ))
}

/// `cluster-info`: key, size, principal and succession list, for operators.
fn cluster_info(layers: &Layers<'_>) -> String {
    let cluster = layers.cluster();
    let succession: Vec<String> = cluster
        .members
        .iter()
        .map(|member| member.node_id.to_string())
        .collect();
    format!(
        "cluster_key={:X};cluster_size={};cluster_principal={};succession={};partition_generation={}",
        cluster.cluster_key,
        cluster.size(),
        cluster.principal(),
        succession.join(","),
        partition_generation(layers)
    )
}

fn namespace_config_pairs(namespace: &Namespace, rack_id: u32) -> Vec<(String, String)> {
    let config = &namespace.config;
    let mut pairs = vec![
        (
            "replication-factor".to_owned(),
            config.replication_factor.to_string(),
        ),
        // The node's configured rack: Citrine configures racks per node, so
        // every namespace reports the same one.
        ("rack-id".to_owned(), rack_id.to_string()),
        ("default-ttl".to_owned(), config.default_ttl.to_string()),
        ("nsup-period".to_owned(), config.nsup_period.to_string()),
        (
            "allow-ttl-without-nsup".to_owned(),
            config.allow_ttl_without_nsup.to_string(),
        ),
        (
            "max-record-size".to_owned(),
            config.max_record_size.to_string(),
        ),
        ("active-rack".to_owned(), config.sc.active_rack.to_string()),
        ("auto-revive".to_owned(), config.sc.auto_revive.to_string()),
        (
            "strong-consistency".to_owned(),
            config.sc.strong_consistency.to_string(),
        ),
        (
            "strong-consistency-allow-expunge".to_owned(),
            config.sc.allow_expunge.to_string(),
        ),
        (
            "prefer-minimal-migration".to_owned(),
            config.prefer_minimal_migration.to_string(),
        ),
        (
            "conflict-resolution-policy".to_owned(),
            config.conflict_resolution_policy.name().to_owned(),
        ),
        (
            "tomb-raider-eligible-age".to_owned(),
            config.tomb_raider_eligible_age.to_string(),
        ),
    ];
    pairs.extend(citrine_data::txn::config_pairs(namespace));
    match config.storage_engine {
        StorageEngineConfig::Memory { data_size, .. } => {
            pairs.push(("storage-engine".to_owned(), "memory".to_owned()));
            pairs.push(("storage-engine.data-size".to_owned(), data_size.to_string()));
        }
        StorageEngineConfig::Device {
            ref engine,
            flush_max_ms,
            ref index_image,
        } => {
            let files: Vec<String> = engine
                .paths
                .iter()
                .map(|path| path.display().to_string())
                .collect();
            pairs.push(("storage-engine".to_owned(), "device".to_owned()));
            pairs.push(("storage-engine.files".to_owned(), files.join(",")));
            pairs.push((
                "storage-engine.filesize".to_owned(),
                engine.file_size.to_string(),
            ));
            pairs.push((
                "storage-engine.write-block-size".to_owned(),
                engine.write_block_size.to_string(),
            ));
            pairs.push((
                "storage-engine.flush-max-ms".to_owned(),
                flush_max_ms.to_string(),
            ));
            pairs.push((
                "storage-engine.defrag-lwm-pct".to_owned(),
                engine.defrag_lwm_pct.to_string(),
            ));
            pairs.push((
                "storage-engine.commit-to-device".to_owned(),
                engine.commit_to_device.to_string(),
            ));
            pairs.push((
                "storage-engine.post-write-queue".to_owned(),
                engine.post_write_queue.to_string(),
            ));
            pairs.push((
                "storage-engine.direct-io".to_owned(),
                (engine.io_mode == citrine_storage::device::IoMode::Direct).to_string(),
            ));
            pairs.push((
                "storage-engine.fast-restart".to_owned(),
                index_image.is_some().to_string(),
            ));
            pairs.push((
                "storage-engine.index-checkpoint-period".to_owned(),
                engine.checkpoint_period_s.to_string(),
            ));
        }
    }
    pairs.extend(crate::compression_info::config_pairs(namespace));
    pairs.push((
        "storage-engine.enable-benchmarks-storage".to_owned(),
        namespace.storage.benchmarks().is_on().to_string(),
    ));
    pairs.extend(crate::eviction_info::config_pairs(namespace));
    pairs
}

fn namespace_info(layers: &Layers<'_>, namespace: &Namespace) -> String {
    let mut pairs = namespace_usage_pairs(layers, namespace);
    let stats = &namespace.stats;
    let counters = |table: &[(&str, NamespaceCounter)]| {
        let read = |(name, read): &(&str, NamespaceCounter)| ((*name).to_owned(), read(stats));
        table.iter().map(read).collect::<Vec<_>>()
    };
    let subs = stats
        .sub
        .pairs()
        .map(|(name, value)| (name.to_owned(), value));
    let listed = counters(NAMESPACE_COUNTERS).into_iter().chain(subs);
    let listed = listed.chain(counters(NAMESPACE_FAILURES));
    pairs.extend(listed.map(|(name, value)| (name, value.to_string())));
    let (migrate_tx, migrate_rx) = layers
        .migrations()
        .namespace_remaining(&namespace.config.name);
    pairs.push((
        "migrate_tx_partitions_remaining".into(),
        migrate_tx.to_string(),
    ));
    pairs.push((
        "migrate_rx_partitions_remaining".into(),
        migrate_rx.to_string(),
    ));
    if let Some(device) = namespace.storage.device() {
        pairs.extend(device.info_pairs());
    }
    pairs.extend(crate::compression_info::stat_pairs(namespace));
    pairs.extend(crate::sc::stat_pairs(layers, namespace));
    pairs.extend(crate::txn::stat_pairs(namespace));
    pairs.extend(namespace_config_pairs(namespace, layers.config.rack_id));
    join_pairs(&pairs, ';')
}

/// A namespace's size in the cluster and its use of memory and storage,
/// as `namespace/NS` opens.
fn namespace_usage_pairs(layers: &Layers<'_>, namespace: &Namespace) -> Vec<(String, String)> {
    let cluster = layers.cluster();
    let stats = &namespace.stats;
    let objects = stats.objects.load(Ordering::Relaxed).max(0);
    let index_bytes = namespace.index.table_bytes();
    stats
        .index_used_bytes
        .store(index_bytes as u64, Ordering::Relaxed);
    let replication_factor = cluster
        .namespace(&namespace.config.name)
        .map_or(1, |map| map.column_bitmaps.len());
    let bytes_per_object = if objects > 0 {
        format!("{:.1}", index_bytes as f64 / objects as f64)
    } else {
        "0".into()
    };
    vec![
        ("ns_cluster_size".into(), cluster.size().to_string()),
        (
            "effective_replication_factor".into(),
            replication_factor.to_string(),
        ),
        ("objects".into(), objects.to_string()),
        ("master_objects".into(), objects.to_string()),
        ("prole_objects".into(), "0".into()),
        ("non_replica_objects".into(), "0".into()),
        ("index_used_bytes".into(), index_bytes.to_string()),
        // Durable deletes' tombstones only, as the reference counts them.
        (
            "tombstones".into(),
            namespace.index.durable_tombstone_count().to_string(),
        ),
        ("index_bytes_per_object".into(), bytes_per_object),
        (
            "data_used_bytes".into(),
            namespace.storage.used_bytes().to_string(),
        ),
        ("data_total_bytes".into(), namespace.data_size().to_string()),
        ("data_used_pct".into(), namespace.used_pct().to_string()),
        (
            "data_avail_pct".into(),
            namespace.available_pct().to_string(),
        ),
        ("stop_writes".into(), namespace.stop_writes().to_string()),
        // Times as the reference counts them: seconds and milliseconds
        // since the citrusleaf epoch (0: never truncated).
        (
            "current_time".into(),
            layers.now().citrusleaf_seconds.to_string(),
        ),
        (
            "truncate_lut".into(),
            citrine_types::citrusleaf_epoch_ms(stats.truncate_lut_ms.load(Ordering::Relaxed))
                .to_string(),
        ),
    ]
}

/// A namespace statistic's reader.
type NamespaceCounter = fn(&NamespaceStats) -> u64;

/// The namespace's counters `namespace/NS` answers, by the reference's
/// names, in its order.
const NAMESPACE_COUNTERS: &[(&str, NamespaceCounter)] = &[
    ("expired_objects", |s| {
        s.expired_objects.load(Ordering::Relaxed)
    }),
    ("evicted_objects", |s| {
        s.evicted_objects.load(Ordering::Relaxed)
    }),
    ("truncated_objects", |s| {
        s.truncated_objects.load(Ordering::Relaxed)
    }),
    ("stop_writes_count", |s| {
        s.stop_writes_count.load(Ordering::Relaxed)
    }),
    ("client_read_success", |s| {
        s.client_read_success.load(Ordering::Relaxed)
    }),
    ("client_read_not_found", |s| {
        s.client_read_not_found.load(Ordering::Relaxed)
    }),
    ("client_read_error", |s| {
        s.client_read_error.load(Ordering::Relaxed)
    }),
    ("client_write_success", |s| {
        s.client_write_success.load(Ordering::Relaxed)
    }),
    ("client_write_error", |s| {
        s.client_write_error.load(Ordering::Relaxed)
    }),
    ("client_delete_success", |s| {
        s.client_delete_success.load(Ordering::Relaxed)
    }),
    ("client_delete_not_found", |s| {
        s.client_delete_not_found.load(Ordering::Relaxed)
    }),
    ("read_touch_success", |s| {
        s.read_touch_success.load(Ordering::Relaxed)
    }),
    ("read_touch_skip", |s| {
        s.read_touch_skip.load(Ordering::Relaxed)
    }),
    ("read_touch_error", |s| {
        s.read_touch_error.load(Ordering::Relaxed)
    }),
    ("client_read_filtered_out", |s| {
        s.client_read_filtered_out.load(Ordering::Relaxed)
    }),
    ("client_write_filtered_out", |s| {
        s.client_write_filtered_out.load(Ordering::Relaxed)
    }),
    ("client_delete_filtered_out", |s| {
        s.client_delete_filtered_out.load(Ordering::Relaxed)
    }),
    ("client_udf_complete", |s| {
        s.client_udf_complete.load(Ordering::Relaxed)
    }),
    ("client_udf_error", |s| {
        s.client_udf_error.load(Ordering::Relaxed)
    }),
    ("client_lang_read_success", |s| {
        s.client_lang_read_success.load(Ordering::Relaxed)
    }),
    ("client_lang_write_success", |s| {
        s.client_lang_write_success.load(Ordering::Relaxed)
    }),
    ("client_lang_delete_success", |s| {
        s.client_lang_delete_success.load(Ordering::Relaxed)
    }),
    ("client_lang_error", |s| {
        s.client_lang_error.load(Ordering::Relaxed)
    }),
];

/// The namespace's failure counters, after its sub-transactions'
/// statistics, in the reference's order.
const NAMESPACE_FAILURES: &[(&str, NamespaceCounter)] = &[
    ("fail_generation", |s| {
        s.fail_generation.load(Ordering::Relaxed)
    }),
    ("fail_key_busy", |s| s.fail_key_busy.load(Ordering::Relaxed)),
    ("fail_record_too_big", |s| {
        s.fail_record_too_big.load(Ordering::Relaxed)
    }),
    // Citrine's own: partitions stopped after a change to them was cut
    // short (`Namespace::serving`).
    ("partitions_failed", |s| {
        s.partitions_failed.load(Ordering::Relaxed)
    }),
];

impl Service {
    /// Sets the `network` context of `get-config` (once, before the node
    /// serves): the server's resolved service, heartbeat and fabric
    /// settings as `(name, value)` pairs in the reference's order.
    pub fn set_network_config(&self, pairs: Vec<(String, String)>) {
        let _ = self.network.set(pairs);
    }
}

fn join_pairs(pairs: &[(String, String)], separator: char) -> String {
    let mut out = String::new();
    for (index, (key, value)) in pairs.iter().enumerate() {
        if index > 0 {
            out.push(separator);
        }
        let _ = write!(out, "{key}={value}");
    }
    out
}

pub(crate) fn statistics(service: &Service) -> String {
    let layers = service.layers();
    let mut pairs = cluster_statistics(&layers, service.uptime_seconds());
    pairs.extend(service_statistics(layers.stats));
    pairs.extend(distribution_statistics(&layers.dist.stats));
    pairs.extend(migration_statistics(layers.migrations()));
    pairs.extend(
        service
            .security()
            .map(security_statistics)
            .unwrap_or_default(),
    );
    join_pairs(&pairs, ';')
}

/// A statistic's name and a counter's current value.
fn counter(name: &str, value: &AtomicU64) -> (String, String) {
    (name.to_owned(), value.load(Ordering::Relaxed).to_string())
}

/// The view this node is in, its uptime and the node's records.
fn cluster_statistics(layers: &Layers<'_>, uptime_seconds: u64) -> Vec<(String, String)> {
    let cluster = layers.cluster();
    let objects: i64 = layers
        .namespaces()
        .map(|namespace| namespace.stats.objects.load(Ordering::Relaxed).max(0))
        .sum();
    vec![
        ("cluster_size".into(), cluster.size().to_string()),
        ("cluster_key".into(), cluster_key(layers)),
        ("cluster_integrity".into(), "true".into()),
        // Not serving yet: out of any view, or back in one whose exchange
        // has not resolved.
        (
            "cluster_is_member".into(),
            (!layers.is_orphan()).to_string(),
        ),
        ("cluster_principal".into(), cluster.principal().to_string()),
        (
            "cluster_clock_skew_ms".into(),
            layers.dist.cluster_clock_skew_ms().to_string(),
        ),
        ("uptime".into(), uptime_seconds.to_string()),
        ("objects".into(), objects.to_string()),
        (
            "tombstones".into(),
            layers
                .namespaces()
                .map(|namespace| namespace.index.durable_tombstone_count())
                .sum::<u64>()
                .to_string(),
        ),
    ]
}

/// The client-facing service's counters: connections, batches, scans,
/// requests.
fn service_statistics(stats: &crate::NodeStats) -> Vec<(String, String)> {
    vec![
        counter("client_connections", &stats.client_connections),
        counter(
            "client_connections_opened",
            &stats.client_connections_opened,
        ),
        counter(
            "client_connections_closed",
            &stats.client_connections_closed,
        ),
        counter("reaped_fds", &stats.reaped_fds),
        counter("proto_fd_max_refused", &stats.proto_fd_max_refused),
        counter("client_connections_moved", &stats.client_connections_moved),
        counter("client_read_ahead_pauses", &stats.client_read_ahead_pauses),
        counter("batch_index_initiate", &stats.batch.requests),
        counter("batch_index_error", &stats.batch.errors),
        counter("batch_index_rows", &stats.batch.rows),
        counter("scan_basic_started", &stats.scan.started),
        counter("scan_basic_complete", &stats.scan.completed),
        counter("scan_basic_refused", &stats.scan.refused),
        counter("scan_basic_records", &stats.scan.records),
        counter("proto_errors", &stats.proto_errors),
        counter("info_requests", &stats.info_requests),
        (
            "transactions".into(),
            stats.transactions.load(Ordering::Relaxed).to_string(),
        ),
        counter("compressed_requests", &stats.compressed_requests),
        counter("service_stalls", &stats.service_stalls),
    ]
}

/// The distribution layer's counters: proxies, replica writes, refusals.
fn distribution_statistics(
    dist_stats: &citrine_distribution::DistributionStats,
) -> Vec<(String, String)> {
    vec![
        counter("proxied_out", &dist_stats.proxied_out),
        counter("proxied_in", &dist_stats.proxied_in),
        counter("replica_reads", &dist_stats.replica_reads),
        counter("replica_write_retries", &dist_stats.replica_write_retries),
        counter("stall_refusals", &dist_stats.stall_refusals),
        counter("expired_refusals", &dist_stats.expired_refusals),
        counter(
            "replica_writes_refused_not_holder",
            &dist_stats.replica_writes_refused_not_holder,
        ),
        counter("proxy_hops_exceeded", &dist_stats.proxy_hops_exceeded),
        counter(
            "peer_messages_malformed",
            &dist_stats.peer_messages_malformed,
        ),
        counter("replica_reconciles_done", &dist_stats.reconciles_done),
        counter("replica_reconciles_dropped", &dist_stats.reconciles_dropped),
    ]
}

/// Migrations in flight and done.
fn migration_statistics(migrations: &crate::migration::Migrations) -> Vec<(String, String)> {
    vec![
        (
            "migrate_partitions_remaining".into(),
            (migrations.tx_remaining() + migrations.rx_remaining()).to_string(),
        ),
        (
            "migrate_tx_partitions_remaining".into(),
            migrations.tx_remaining().to_string(),
        ),
        (
            "migrate_rx_partitions_remaining".into(),
            migrations.rx_remaining().to_string(),
        ),
        counter("migrate_records_sent", &migrations.records_sent),
        counter("migrate_records_received", &migrations.records_received),
        counter("migrate_partitions_sent", &migrations.partitions_sent),
        counter("migrate_records_skipped", &migrations.records_skipped),
        counter("migrate_records_pulled", &migrations.records_pulled),
        counter("migrate_partitions_dropped", &migrations.partitions_dropped),
        counter("migrate_exchanges", &migrations.exchanges),
        counter("migrate_dupres_runs", &migrations.dupres_runs),
        counter("migrate_dupres_failures", &migrations.dupres_failures),
        counter("migrate_acting_reads", &migrations.acting_reads),
        (
            "migrate_pinned_copies".into(),
            migrations.pins.deferred().to_string(),
        ),
        ("migrate_allowed".into(), "true".into()),
    ]
}

/// One set's properties, `objects=N:...:stop-writes-size=0` (no separator
/// after the last); `tombstones` is the namespace's tombstone count per set
/// (`PartitionTable::durable_tombstones_by_set`). `truncate_lut` counts
/// milliseconds since the citrusleaf epoch, as the reference reports it
/// (0: never truncated).
fn set_properties(
    indexes: &crate::sindex::Indexes<'_>,
    namespace: &Namespace,
    id: u16,
    name: &[u8],
    tombstones: &std::collections::HashMap<u16, u64>,
) -> String {
    let stats = namespace.sets.stats(id);
    let truncate_lut = namespace.sets.reported_truncation(id);
    format!(
        "objects={}:tombstones={}:data_used_bytes={}:truncate_lut={}:sindexes={}:index_populating=false:truncating=false:default-read-touch-ttl-pct=0:default-ttl={}:disable-eviction=false:enable-index=false:stop-writes-count=0:stop-writes-size=0",
        stats.objects.load(Ordering::Relaxed).max(0),
        tombstones.get(&id).copied().unwrap_or(0),
        stats.data_used_bytes.load(Ordering::Relaxed).max(0),
        citrine_types::citrusleaf_epoch_ms(truncate_lut),
        crate::sindex::count_on_set(indexes, namespace, name),
        namespace.config.default_ttl
    )
}

/// `sets`, `sets/NS` and `sets/NS/SET`, read as the reference reads them:
/// everything after `sets` and one separator (`/` or `:`) is `NS[/SET]`,
/// the set being the rest of the line after the namespace's `/`. Nothing
/// there lists every namespace's sets; an unknown namespace (an empty one
/// included) answers `ns_type=unknown`. Each set is
/// `ns=NS:set=SET:PROPERTIES;`; with a set named, only its properties,
/// ended by `;` too (empty for a set that does not exist).
fn sets(indexes: &crate::sindex::Indexes<'_>, command: &InfoCommand<'_>) -> String {
    let rest = command.line.get(command.name.len() + 1..).unwrap_or("");
    let (namespace_filter, set_filter) = match rest.split_once('/') {
        _ if rest.is_empty() => (None, None),
        Some((namespace, set)) => (Some(namespace), Some(set)),
        None => (Some(rest), None),
    };
    if let Some(name) = namespace_filter {
        let Some(namespace) = indexes.layers.namespace(name.as_bytes()) else {
            return "ns_type=unknown".to_owned();
        };
        if let Some(set) = set_filter {
            return match namespace.sets.existing_id(set.as_bytes()) {
                Some(id) if id != 0 => {
                    let tombstones = namespace.index.durable_tombstones_by_set();
                    let properties =
                        set_properties(indexes, namespace, id, set.as_bytes(), &tombstones);
                    format!("{properties};")
                }
                _ => String::new(),
            };
        }
    }
    let mut out = String::new();
    for namespace in indexes.layers.namespaces() {
        if namespace_filter.is_some_and(|name| name != namespace.config.name) {
            continue;
        }
        let tombstones = namespace.index.durable_tombstones_by_set();
        for (id, name) in namespace.sets.all() {
            let properties = set_properties(indexes, namespace, id, &name, &tombstones);
            let _ = write!(
                out,
                "ns={}:set={}:{properties};",
                namespace.config.name,
                String::from_utf8_lossy(&name)
            );
        }
    }
    out
}

fn get_config(service: &Service, command: &InfoCommand<'_>) -> String {
    let context = command.param("context").unwrap_or("service");
    match context {
        "service" => {
            let limits = &service.client_limits;
            let pairs: Vec<(String, String)> = vec![
                ("cluster-name".into(), service.config.cluster_name.clone()),
                ("node-id".into(), service.node_id.to_string()),
                (
                    "proto-fd-idle-ms".into(),
                    limits.proto_fd_idle_ms.load(Ordering::Relaxed).to_string(),
                ),
                (
                    "proto-fd-max".into(),
                    limits.proto_fd_max.load(Ordering::Relaxed).to_string(),
                ),
                (
                    "batch-max-requests".into(),
                    service
                        .batch_max_requests
                        .load(Ordering::Relaxed)
                        .to_string(),
                ),
                (
                    "migrate-max-partitions".into(),
                    service
                        .migrations()
                        .max_partitions
                        .load(Ordering::Relaxed)
                        .to_string(),
                ),
                (
                    "migrate-sleep".into(),
                    service
                        .migrations()
                        .sleep_us
                        .load(Ordering::Relaxed)
                        .to_string(),
                ),
                (
                    "migrate-max-records-per-sec".into(),
                    service
                        .migrations()
                        .max_records_per_sec
                        .load(Ordering::Relaxed)
                        .to_string(),
                ),
                (
                    "service-threads".into(),
                    std::thread::available_parallelism()
                        .map(|count| count.get())
                        .unwrap_or(1)
                        .to_string(),
                ),
            ];
            join_pairs(&pairs, ';')
        }
        "network" => match service.network.get() {
            Some(pairs) => join_pairs(pairs, ';'),
            None => {
                let pairs: Vec<(String, String)> = vec![
                    ("service.port".into(), service.config.port.to_string()),
                    (
                        "service.access-address".into(),
                        service.config.access_address.clone(),
                    ),
                ];
                join_pairs(&pairs, ';')
            }
        },
        "namespace" => {
            let name = command.param("namespace").or_else(|| command.param("id"));
            match name.and_then(|name| service.namespace(name.as_bytes())) {
                Some(namespace) => {
                    let mut pairs = namespace_config_pairs(namespace, service.config.rack_id);
                    let index = service.namespace_index(namespace.config.name.as_bytes());
                    let benchmarks = service.latencies().benchmarks();
                    pairs.extend(
                        index
                            .map(|at| benchmarks.config_pairs(at))
                            .unwrap_or_default(),
                    );
                    join_pairs(&pairs, ';')
                }
                None => "ERROR:4:namespace not found".to_owned(),
            }
        }
        // Without security the answer is empty, as a server without the
        // security module answers.
        "security" => service.security().map(security_config).unwrap_or_default(),
        _ => "ERROR:4:unknown context".to_owned(),
    }
}

/// The `security` context's settings, with security on (and the audit
/// trail's `log.report-*` / `syslog.report-*` when it runs).
fn security_config(guard: &crate::security::Guard) -> String {
    let config = guard.with(|security| security.config.clone());
    let mut text = format!(
        "enable-security=true;enable-quotas={};session-ttl={}",
        config.enable_quotas, config.session_ttl_s
    );
    if let Some(audit) = guard.audit() {
        let pairs = crate::security::audit::config_pairs(&audit.settings());
        text.push(';');
        text.push_str(&join_pairs(&pairs, ';'));
    }
    let ldap = crate::security::external::config_pairs(guard);
    if !ldap.is_empty() {
        text.push(';');
        text.push_str(&join_pairs(&ldap, ';'));
    }
    text
}

/// Access control's counters: failed logins (`login_failures`) and audit
/// lines the writer could not keep up with (`audit_lines_dropped`).
fn security_statistics(guard: &crate::security::Guard) -> Vec<(String, String)> {
    vec![
        counter("login_failures", &guard.login_failures.total),
        (
            "audit_lines_dropped".into(),
            guard.audit().map_or(0, |audit| audit.dropped()).to_string(),
        ),
    ]
}

/// `set-config:context=security;log.report-violation=true` and the
/// other audit switches ([`crate::security::audit::Audit::set`]).
fn set_security_config(service: &Service, command: &InfoCommand<'_>) -> String {
    let Some(audit) = service.security().and_then(|guard| guard.audit()) else {
        return "ERROR:4:security is not enabled".to_owned();
    };
    let params: Vec<(&str, &str)> = command
        .params
        .iter()
        .filter(|(name, _)| *name != "context")
        .map(|(name, value)| (*name, *value))
        .collect();
    match audit.set(&params) {
        Ok(()) => "ok".to_owned(),
        Err(error) => format!("ERROR:4:{error}"),
    }
}

/// `set-config:context=service;NAME=VALUE[;...]`: the migration throttles
/// and `proto-fd-idle-ms` change at run time (the migration driver reads them before every
/// batch). Every value is checked before any is applied.
fn set_config(
    layers: &Layers<'_>,
    limits: &crate::client_limits::ClientLimits,
    command: &InfoCommand<'_>,
) -> String {
    match command.param("context") {
        Some("service") => {}
        Some("namespace") if crate::eviction_info::sets(command) => {
            return crate::eviction_info::set_config(layers, command)
        }
        Some("namespace") if crate::benchmarks::names_benchmarks(command) => {
            return crate::benchmarks::set_config(layers, command)
        }
        Some("namespace") if crate::txn::sets(command) => {
            return crate::txn::set_config(layers, command)
        }
        Some("namespace") => return crate::compression_info::set_config(layers, command),
        Some(_) => return "ERROR:4:only context=service or namespace can be set".to_owned(),
        None => return "ERROR:4:missing context".to_owned(),
    }
    let migrations = layers.migrations();
    let mut changes: Vec<Box<dyn Fn() + '_>> = Vec::new();
    for (name, value) in &command.params {
        if *name == "context" {
            continue;
        }
        let Ok(number) = value.parse::<u64>() else {
            return format!("ERROR:4:{name} must be a non-negative integer");
        };
        match *name {
            "migrate-max-partitions" if (1..=64).contains(&number) => {
                changes.push(Box::new(move || {
                    migrations
                        .max_partitions
                        .store(number as u32, Ordering::Relaxed)
                }))
            }
            "migrate-max-partitions" => {
                return "ERROR:4:migrate-max-partitions must be 1 to 64".to_owned()
            }
            "migrate-sleep" if number <= 1_000_000 => changes.push(Box::new(move || {
                migrations.sleep_us.store(number as u32, Ordering::Relaxed)
            })),
            "migrate-sleep" => {
                return "ERROR:4:migrate-sleep must be at most 1000000 microseconds".to_owned()
            }
            "migrate-max-records-per-sec" => changes.push(Box::new(move || {
                migrations
                    .max_records_per_sec
                    .store(number, Ordering::Relaxed)
            })),
            "proto-fd-idle-ms" => {
                let Ok(idle_ms) = u32::try_from(number) else {
                    return format!("ERROR:4:proto-fd-idle-ms must be at most {}", u32::MAX);
                };
                changes.push(Box::new(move || {
                    limits.proto_fd_idle_ms.store(idle_ms, Ordering::Relaxed)
                }))
            }
            _ => return format!("ERROR:4:{name} cannot be set at run time"),
        }
    }
    if changes.is_empty() {
        return "ERROR:4:nothing to set".to_owned();
    }
    for change in changes {
        change();
    }
    "ok".to_owned()
}

/// `set-config`, `get-config` and `get-stats` with `context=xdr`: the
/// server's XDR answers them.
fn xdr(service: &Service, command: &InfoCommand<'_>) -> String {
    if command.param("context") != Some("xdr") {
        return "ERROR:4:only context=xdr has statistics here".to_owned();
    }
    match (service.xdr(), command.name) {
        (Some(xdr), "set-config") => xdr.set_config(&command.params),
        (Some(xdr), "get-config") => xdr.get_config(&command.params),
        (Some(xdr), _) => xdr.get_stats(&command.params),
        (None, _) => "ERROR:4:xdr is not running".to_owned(),
    }
}

fn cluster_stable(layers: &Layers<'_>, command: &InfoCommand<'_>) -> String {
    if let Some(size) = command.param("size") {
        if size != layers.cluster().size().to_string() {
            return "ERROR::cluster not specified size".to_owned();
        }
    }
    let pending = match command.param("namespace") {
        Some(name) => {
            if layers.namespace(name.as_bytes()).is_none() {
                return "ERROR::unknown namespace".to_owned();
            }
            let (tx, rx) = layers.migrations().namespace_remaining(name);
            tx + rx
        }
        None => layers.migrations().tx_remaining() + layers.migrations().rx_remaining(),
    };
    let pending = pending + u64::from(layers.migrations().exchanging());
    if crate::sc::any_unavailable(layers, command.param("namespace")) {
        return "ERROR::unstable-cluster".to_owned();
    }
    if pending > 0 && command.param("ignore-migrations") != Some("true") {
        return "ERROR::unstable-cluster".to_owned();
    }
    cluster_key(layers)
}

/// `partition-checksums:namespace=NS`: for every partition holding live
/// records, `pid:count:checksum` (`;`-separated), the checksum being the XOR
/// of a 64-bit FNV-1a hash of each record's digest, generation, void time,
/// last-update time, set name and stored body. Two nodes holding identical
/// copies of a partition answer identical entries for it; used by the
/// replication tests to compare master and replica copies.
fn partition_checksums(layers: &Layers<'_>, command: &InfoCommand<'_>) -> String {
    let Some(namespace) = command
        .param("namespace")
        .and_then(|name| layers.namespace(name.as_bytes()))
    else {
        return "ERROR:20:namespace not found".to_owned();
    };
    let now = layers.now();
    let mut entries = Vec::new();
    for pid in 0..PARTITIONS {
        let Some(partition_id) = citrine_types::PartitionId::new(pid as u16) else {
            continue;
        };
        let partition = namespace.index.partition(partition_id).read();
        let mut count = 0u64;
        let mut checksum = 0u64;
        let mut bytes = Vec::new();
        for (digest, entry) in partition.iter() {
            let meta = entry.meta();
            if !crate::transaction::is_live(namespace, &meta, now) {
                continue;
            }
            bytes.clear();
            bytes.extend_from_slice(&digest.0);
            bytes.extend_from_slice(&meta.generation.to_be_bytes());
            bytes.extend_from_slice(&meta.void_time.to_be_bytes());
            bytes.extend_from_slice(&meta.last_update_ms.to_be_bytes());
            bytes.extend_from_slice(&namespace.sets.name(meta.set_id).unwrap_or_default());
            if let Ok(body) = namespace.storage.read(&entry.location) {
                bytes.extend_from_slice(&body);
            }
            count += 1;
            checksum ^= citrine_cluster::partition_map::fnv1a_64(&bytes);
        }
        if count > 0 {
            entries.push(format!("{pid}:{count}:{checksum:016X}"));
        }
    }
    entries.join(";")
}

#[cfg(test)]
mod tests;
