//! The shared metadata stores as the node's features use them: which info
//! commands change which store ([`Store`]), the wait of such a command's
//! answer until every other member acknowledged the change
//! ([`Service::sync_stores`], at most [`SYNC_TIMEOUT`]), and the blocking
//! push of a store the `citrine-sindex` thread makes ([`push_to_peers`]).
//! The stores are the index definitions (`sindex.smd`), the UDF modules
//! (`udf.smd`), the truncations (`truncate.smd`) and, with security on,
//! the users and roles (`security.smd`), the strong-consistency
//! rosters (`roster.smd`) and the XDR filters (`xdr-filters.smd`). The wait: the info
//! answer names the stores a request changed (`info::answer_request`),
//! `Service::handle_streaming` returns a remote continuation for them, and
//! completing it pushes each store to every other member and awaits their
//! acknowledgements before the answer goes out.
//! What the stores have in common — versions, files, push clocks — is the
//! distribution layer's ([`citrine_distribution::smd`], re-exported).

pub use citrine_distribution::smd::*;

use crate::replication::call_kind;
use crate::Service;
use citrine_distribution::Distribution;
use citrine_types::ResultCode;

/// A store the members share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Store {
    SindexDefinitions,
    UdfModules,
    Truncations,
    /// Users and roles (see [`crate::security`]); changed by admin
    /// commands, not info commands.
    Security,
    /// Strong-consistency rosters (`citrine_distribution::sc::store`).
    Rosters,
    /// XDR filter expressions (the server's `xdr::filters`).
    XdrFilters,
}

impl Store {
    /// The store the info command `name` changes when it answers `ok`.
    pub(crate) fn changed_by(name: &str) -> Option<Store> {
        match name {
            "sindex-create" | "sindex-delete" => Some(Store::SindexDefinitions),
            "udf-put" | "udf-remove" => Some(Store::UdfModules),
            "truncate" | "truncate-namespace" | "truncate-undo" | "truncate-namespace-undo" => {
                Some(Store::Truncations)
            }
            "roster-set" | "recluster" => Some(Store::Rosters),
            "xdr-set-filter" => Some(Store::XdrFilters),
            _ => None,
        }
    }

    fn call_kind(self) -> u8 {
        match self {
            Store::SindexDefinitions => call_kind::SINDEX_DEFINITIONS,
            Store::UdfModules => call_kind::UDF_MODULES,
            Store::Truncations => call_kind::TRUNCATIONS,
            Store::Security => call_kind::SECURITY,
            Store::Rosters => call_kind::ROSTERS,
            Store::XdrFilters => call_kind::XDR_FILTERS,
        }
    }

    /// The store's whole text, as its push carries it.
    fn text(self, service: &Service) -> String {
        match self {
            Store::SindexDefinitions => service.indexes().definitions_text(),
            Store::UdfModules => service.udf_modules().text(),
            Store::Truncations => service.dist().truncations_text(),
            Store::Security => service
                .security()
                .map(crate::security::store_text)
                .unwrap_or_default(),
            Store::Rosters => service.dist().rosters_text(),
            Store::XdrFilters => service
                .xdr()
                .map(|xdr| xdr.filters_text())
                .unwrap_or_default(),
        }
    }
}

impl Service {
    /// Sends each of `stores` to every other member of the current view at
    /// once and waits until every one answered (see [`sync`]).
    pub(crate) async fn sync_stores(&self, stores: &[Store]) {
        if self.fabric().is_none() {
            return;
        }
        let texts: Vec<(Store, String)> = stores
            .iter()
            .map(|store| (*store, store.text(self)))
            .collect();
        sync(self.dist(), texts).await;
    }
}

/// Sends each store's text to every other member of the current view at
/// once and waits until every one answered, at most [`SYNC_TIMEOUT`]. A
/// member that does not acknowledge is logged; it gets the change from the
/// pushes that follow. An empty text is not sent.
async fn sync(dist: &Distribution, texts: Vec<(Store, String)>) {
    let Some(fabric) = dist.fabric() else {
        return;
    };
    let (peers, _) = dist.peers();
    let mut sent = Vec::new();
    let mut calls = Vec::new();
    for (store, text) in texts.iter().filter(|(_, text)| !text.is_empty()) {
        for peer in &peers {
            sent.push((*peer, *store));
            calls.push(fabric.call(
                *peer,
                store.call_kind(),
                text.as_bytes().to_vec(),
                SYNC_TIMEOUT,
            ));
        }
    }
    let answers = crate::replication::join_all(calls).await;
    for ((peer, store), answer) in sent.into_iter().zip(answers) {
        let acknowledged =
            matches!(&answer, Ok(bytes) if bytes.first() == Some(&ResultCode::Ok.code()));
        if !acknowledged {
            tracing::warn!(?peer, ?store, ?answer, "a change was answered before this member acknowledged it; it gets the change from the next push");
        }
    }
}

/// Sends a store's `text()` to every other member when `clock` says a push
/// is due (called by the `citrine-sindex` thread, which may block). A peer
/// that does not answer gets the next periodic push.
pub(crate) fn push_to_peers(
    dist: &Distribution,
    clock: &PushClock,
    kind: u8,
    what: &str,
    text: impl FnOnce() -> String,
) {
    let Some((fabric, peers, text)) = due_push(dist, clock, text) else {
        return;
    };
    for peer in peers {
        let call = fabric.call(peer, kind, text.as_bytes().to_vec(), PUSH_TIMEOUT);
        if let Err(error) = crate::block_on(call) {
            tracing::debug!(?peer, "{what} not pushed: {error:?}");
        }
    }
}
