//! Strong-consistency namespaces as the node serves them today (issue 39):
//! the roster info commands and the refusal of every data request.
//!
//! Owns: `roster:`, `roster-set:`, `recluster:` and `revive:` (formats of
//! the protocol notes 08 §1; the rosters themselves are the distribution
//! layer's shared store, `citrine_distribution::sc::store`), and
//! [`unavailable`] / [`refuses`].
//!
//! Invariants:
//! - an SC namespace acknowledges no write and serves no read: its data
//!   paths (regimes, replication in the regime, availability rules) do not
//!   exist yet, so every partition is unavailable and every single-record
//!   request, batch row, scan, query and aggregation on it answers 11
//!   (partition unavailable), whatever its roster. Nothing acknowledged
//!   can then be lost; the roster can already be set and kept. The node
//!   says so: `unavailable_partitions` is 4096 for it and `cluster-stable`
//!   answers `ERROR::unstable-cluster`.
//! - the roster commands answer only for SC namespaces; for an AP one they
//!   answer `ERROR:4:namespace is not strong-consistency` (our text: the
//!   reference's Enterprise answer is not available here; its Community
//!   edition answers `ERROR:25:enterprise only` to all of them).
//! - `recluster:` applies every SC namespace's pending roster on whichever
//!   node receives it (the reference answers `ignored-by-non-principal`
//!   on a non-principal; here any node may apply, and the change reaches
//!   the others as shared metadata before the answer).

use crate::Service;
use citrine_data::namespace::Namespace;
use citrine_distribution::sc::roster::{self, RosterSetError};
use citrine_wire::info::InfoCommand;
use citrine_wire::msg::{field_type, Message};

/// Whether `namespace`'s partitions are all unavailable (an SC namespace).
pub(crate) fn unavailable(namespace: &Namespace) -> bool {
    namespace.config.sc.strong_consistency
}

/// The partitions of `namespace` this node counts unavailable and dead:
/// every one of an SC namespace is unavailable, none is dead (the
/// availability rules that would tell are not wired).
pub(crate) fn stat_pairs(namespace: &Namespace) -> [(String, String); 2] {
    let unavailable = if unavailable(namespace) {
        citrine_types::PARTITIONS
    } else {
        0
    };
    [
        ("unavailable_partitions".into(), unavailable.to_string()),
        ("dead_partitions".into(), "0".into()),
    ]
}

/// Whether `cluster-stable` must answer unstable because partitions are
/// unavailable: of the namespace named, or of any namespace.
pub(crate) fn any_unavailable(layers: &crate::Layers<'_>, namespace: Option<&str>) -> bool {
    match namespace {
        Some(name) => layers.namespace(name.as_bytes()).is_some_and(unavailable),
        None => layers
            .data
            .namespaces_shared()
            .iter()
            .any(|namespace| unavailable(namespace)),
    }
}

/// Whether a request (a scan, query or aggregation) names an SC namespace.
pub(crate) fn refuses(service: &Service, message: &Message<'_>) -> bool {
    message
        .field(field_type::NAMESPACE)
        .and_then(|name| service.namespace(name))
        .is_some_and(unavailable)
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
            // No partition is dead yet (the availability rules are not
            // wired): nothing to revive, as the reference answers then.
            Some(name) => sc_namespace(service, name)
                .map(|_| "ok".to_owned())
                .unwrap_or_else(|error| error),
            None => "ERROR:4:missing namespace".to_owned(),
        },
        _ => "ERROR:4:unrecognized command".to_owned(),
    }
}

/// The SC namespace `name`, or the error answer.
fn sc_namespace<'s>(service: &'s Service, name: &str) -> Result<&'s Namespace, String> {
    let namespace = service
        .namespace(name.as_bytes())
        .ok_or_else(|| "ERROR:4:namespace not found".to_owned())?;
    if !unavailable(namespace) {
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
        .filter(|namespace| unavailable(namespace))
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

/// `recluster:`: every SC namespace's pending roster becomes its roster.
fn recluster(service: &Service) -> String {
    let names: Vec<&str> = service
        .namespaces()
        .filter(|namespace| unavailable(namespace))
        .map(|namespace| namespace.config.name.as_str())
        .collect();
    match service.dist().apply_pending_rosters(&names) {
        Ok(changed) => {
            if !changed.is_empty() {
                tracing::info!(?changed, "pending rosters applied");
            }
            "ok".to_owned()
        }
        Err(message) => format!("ERROR:1:{message}"),
    }
}
