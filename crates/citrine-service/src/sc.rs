//! Strong-consistency namespaces as the node serves them (issue 39): the
//! roster info commands, the partition availability the view decided, and
//! the refusal of every data request.
//!
//! Owns: `roster:`, `roster-set:`, `recluster:` and `revive:` (formats of
//! the protocol notes 08 §1; the rosters themselves are the distribution
//! layer's shared store, `citrine_distribution::sc::store`), the SC
//! namespaces' statistics, `cluster-stable` condition and `replicas`
//! columns ([`stat_pairs`], [`any_unavailable`], [`columns`]), and
//! [`unavailable`] / [`refuses`] / [`refuses_alone`].
//!
//! Invariants:
//! - availability is the view's SC partition map
//!   (`citrine_distribution::sc::partitions`, decided by every member from
//!   the same exchanged versions): `unavailable_partitions` and
//!   `dead_partitions` count it, `cluster-stable` answers
//!   `ERROR::unstable-cluster` while a partition is unavailable, and the
//!   `replicas` answer carries the view's regime and the working replicas
//!   of the available partitions only. Before the view's exchange is
//!   decided every partition counts unavailable.
//! - the namespace's `strong-consistency-serve-data = false` (Citrine's
//!   own; default true) closes the data path below: every data request on
//!   it answers 11 ([`data_closed`]), so nothing can be acknowledged.
//! - otherwise single-record requests on an SC namespace follow the view's SC map
//!   (`citrine_distribution::sc::data_path`): an unavailable partition
//!   answers 11, an available one is served by its master in the regime,
//!   which acknowledges a write only once every replica of the map stored
//!   it. Batch rows take the same path one by one. Foreground scans,
//!   queries and aggregations read each partition on its SC master only
//!   once that master's copy is whole (no fill in flight); any other
//!   partition is answered unavailable (11) for the client to retry.
//!   Background jobs answer 16 (unsupported feature): their writes do not
//!   take the SC replication path yet.
//! - a node without routing (alone, or no fabric) serves an SC partition
//!   only when the SC map makes it the partition's only replica
//!   ([`refuses_alone`]).
//! - the roster commands answer only for SC namespaces; for an AP one they
//!   answer `ERROR:4:namespace is not strong-consistency` (our text: the
//!   reference's Enterprise answer is not available here; its Community
//!   edition answers `ERROR:25:enterprise only` to all of them).
//! - `recluster:` acts on the view's principal only (the member with the
//!   highest node id; a node in no view is its own): there it applies
//!   every SC namespace's pending roster (the change reaches the others as
//!   shared metadata before the answer) and asks for a new view, in which
//!   the members decide again (the principal also starts one when the
//!   roster in force is not the one its view decided with). Any other
//!   node answers `ignored-by-non-principal` and changes nothing, as the
//!   reference (protocol notes 08 §1).
//!   `revive:` marks the namespace's dead partitions for revival at that
//!   next view.

use crate::Service;
use citrine_data::namespace::Namespace;
use citrine_distribution::cluster_state::{bitmap_base64, ClusterState, NamespaceMap};
use citrine_distribution::sc::data_path;
use citrine_distribution::sc::roster::{self, RosterSetError};
use citrine_distribution::Distribution;
use citrine_types::{Digest, ResultCode};
use citrine_wire::info::InfoCommand;
use citrine_wire::msg::{field_type, Message};

/// Whether `namespace` is a strong-consistency namespace.
pub(crate) fn is_sc(namespace: &Namespace) -> bool {
    namespace.config.sc.strong_consistency
}

/// Whether every data request on `namespace` is refused (11): an SC
/// namespace whose data path is closed
/// (`strong-consistency-serve-data = false`).
pub(crate) fn data_closed(namespace: &Namespace) -> bool {
    is_sc(namespace) && !namespace.config.sc.serve_data
}

/// Whether a single-record request on `digest` of `namespace` that this
/// node would run without routing (no other member, or no fabric) is
/// refused (11): for an SC namespace, unless the view's SC map makes this
/// node the partition's master (then it is the only replica in the
/// regime). Routed requests are refused by the distribution layer's
/// `route` when the partition is not available.
pub(crate) fn refuses_alone(dist: &Distribution, namespace: &Namespace, digest: &Digest) -> bool {
    if !is_sc(namespace) {
        return false;
    }
    let cluster = dist.cluster();
    let replicas = data_path::replicas_for(&cluster, namespace, digest.partition());
    replicas != [dist.node_id]
}

/// The (unavailable, dead) partitions of `namespace` in `cluster`: none for
/// an AP namespace, the view's SC map's counts, every partition while the
/// view is not decided.
fn summary(cluster: &ClusterState, namespace: &Namespace) -> (usize, usize) {
    if !is_sc(namespace) {
        return (0, 0);
    }
    match cluster
        .namespace(&namespace.config.name)
        .and_then(|map| map.sc.get())
    {
        Some(map) => (map.unavailable, map.dead),
        None => (citrine_types::PARTITIONS, 0),
    }
}

/// The `unavailable_partitions`, `dead_partitions` and
/// `auto_revived_partitions` statistics of `namespace` (a dead partition
/// counts in both, as the reference's; the last: copies this start kept
/// under `auto-revive`).
pub(crate) fn stat_pairs(
    layers: &crate::Layers<'_>,
    namespace: &Namespace,
) -> [(String, String); 3] {
    let (unavailable, dead) = summary(&layers.cluster(), namespace);
    let revived = layers.dist.sc_auto_revived(&namespace.config.name);
    [
        ("unavailable_partitions".into(), unavailable.to_string()),
        ("dead_partitions".into(), dead.to_string()),
        ("auto_revived_partitions".into(), revived.to_string()),
    ]
}

/// Whether `cluster-stable` must answer unstable because partitions are
/// unavailable: of the namespace named, or of any namespace.
pub(crate) fn any_unavailable(layers: &crate::Layers<'_>, namespace: Option<&str>) -> bool {
    let cluster = layers.cluster();
    match namespace {
        Some(name) => layers
            .namespace(name.as_bytes())
            .is_some_and(|namespace| summary(&cluster, namespace).0 > 0),
        None => layers
            .data
            .namespaces_shared()
            .iter()
            .any(|namespace| summary(&cluster, namespace).0 > 0),
    }
}

/// For an SC namespace, its `replicas` columns on this node: the view's
/// regime and one bitmap per column of the partitions this node serves in
/// it (none while undecided, or while the node is an orphan); `None` for
/// an AP namespace.
pub(crate) fn columns(
    layers: &crate::Layers<'_>,
    map: &NamespaceMap,
) -> Option<(u32, Vec<String>)> {
    if !layers.namespace(map.name.as_bytes()).is_some_and(is_sc) {
        return None;
    }
    let width = map.column_bitmaps.len();
    let me = layers.node_id();
    Some(match map.sc.get().filter(|_| !layers.is_orphan()) {
        Some(sc) => (
            sc.regime,
            (0..width)
                .map(|column| bitmap_base64(sc.column_of(me, column)))
                .collect(),
        ),
        None => (
            layers.dist.sc_regime(&map.name),
            vec![bitmap_base64(std::iter::empty()); width],
        ),
    })
}

/// The refusal of a request without a digest (a scan, query, aggregation
/// or background job) on an SC namespace, if it is refused: 11 while the
/// namespace's data path is closed ([`data_closed`]); 16 (unsupported
/// feature) for a background job, whose writes do not take the SC
/// replication path yet. Foreground scans, queries and aggregations are
/// served partition by partition by the view's SC masters
/// (`crate::scan`).
pub(crate) fn refuses(service: &Service, message: &Message<'_>) -> Option<ResultCode> {
    let namespace = service.namespace(message.field(field_type::NAMESPACE)?)?;
    if data_closed(namespace) {
        return Some(ResultCode::Unavailable);
    }
    (is_sc(namespace) && crate::scan::is_background(message))
        .then_some(ResultCode::UnsupportedFeature)
}

/// The answer to `roster`, `roster-set`, `recluster` or `revive`.
pub(crate) fn answer(service: &Service, command: &InfoCommand<'_>) -> String {
    match command.name {
        "roster" => match command.param("namespace") {
            Some(name) => sc_namespace(service, name)
                .map(|namespace| roster_of(service, namespace).encode())
                .unwrap_or_else(|error| error),
            None => all_rosters(service),
        },
        "roster-set" => roster_set(service, command),
        "recluster" => recluster(service),
        "revive" => match command.param("namespace") {
            // Dead partitions are revived at the next view (`recluster:`
            // asks for it; so does this).
            Some(name) => sc_namespace(service, name)
                .map(|namespace| {
                    service.dist().request_revive(&namespace.config.name);
                    "ok".to_owned()
                })
                .unwrap_or_else(|error| error),
            None => "ERROR:4:missing namespace".to_owned(),
        },
        _ => "ERROR:4:unrecognized command".to_owned(),
    }
}

/// Whether this node is its view's principal (the member with the highest
/// node id), or in no view.
fn is_principal(service: &Service) -> bool {
    service.dist().cluster().principal() == service.node_id
}

/// The SC namespace `name`, or the error answer.
fn sc_namespace<'s>(service: &'s Service, name: &str) -> Result<&'s Namespace, String> {
    let namespace = service
        .namespace(name.as_bytes())
        .ok_or_else(|| "ERROR:4:namespace not found".to_owned())?;
    if !is_sc(namespace) {
        return Err("ERROR:4:namespace is not strong-consistency".to_owned());
    }
    Ok(namespace)
}

/// A namespace's roster, pending roster and observed nodes.
fn roster_of(service: &Service, namespace: &Namespace) -> roster::Roster {
    service
        .dist()
        .roster_of(&namespace.config.name, namespace.config.sc.active_rack)
}

/// `roster:` without a namespace: every SC namespace.
fn all_rosters(service: &Service) -> String {
    let rosters: Vec<(String, roster::Roster)> = service
        .namespaces()
        .filter(|namespace| is_sc(namespace))
        .map(|namespace| (namespace.config.name.clone(), roster_of(service, namespace)))
        .collect();
    roster::encode_all(rosters.iter().map(|(name, roster)| (name.as_str(), roster)))
}

/// `roster-set:namespace=NS;nodes=LIST`: stages the pending roster.
fn roster_set(service: &Service, command: &InfoCommand<'_>) -> String {
    let params = command.line.split_once(':').map_or("", |(_, rest)| rest);
    let set = match roster::parse_roster_set(params) {
        Ok(set) => set,
        Err(RosterSetError::MissingNamespace) => return "ERROR:4:missing namespace".to_owned(),
        Err(RosterSetError::MissingNodes) => return "ERROR:4:missing nodes".to_owned(),
        Err(RosterSetError::Nodes(error)) => return format!("ERROR:4:{error}"),
    };
    if let Err(error) = sc_namespace(service, &set.namespace) {
        return error;
    }
    match service.dist().stage_roster(&set.namespace, set.nodes) {
        Ok(()) => "ok".to_owned(),
        Err(message) => format!("ERROR:1:{message}"),
    }
}

/// `recluster:`: on the principal, every SC namespace's pending roster
/// becomes its roster; elsewhere ignored.
fn recluster(service: &Service) -> String {
    if !is_principal(service) {
        return "ignored-by-non-principal".to_owned();
    }
    let names: Vec<&str> = service
        .namespaces()
        .filter(|namespace| is_sc(namespace))
        .map(|namespace| namespace.config.name.as_str())
        .collect();
    match service.dist().apply_pending_rosters(&names) {
        Ok(changed) => {
            service.dist().request_recluster();
            if !changed.is_empty() {
                tracing::info!(?changed, "pending rosters applied");
            }
            "ok".to_owned()
        }
        Err(message) => format!("ERROR:1:{message}"),
    }
}
