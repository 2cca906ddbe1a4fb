//! Multi-record transactions as the service meets them, around the data
//! layer's [`citrine_data::txn`] (which owns the transaction path itself).
//!
//! Owns: the transaction part of a batch row (each row runs the data
//! layer's path like a single-record request: where no transactions run,
//! a row with a transaction id or a verify or roll bit answers 25 and the
//! batch goes on, as the CE reference answers under respond-all-keys; a
//! version or deadline field alone is ignored), record UDFs inside a
//! transaction (their base and the version they compare with; `udf`
//! keeps their change; 25 where no transactions run), the transaction
//! statistics of `namespace/NS`, and `set-config` of `mrt-duration` and
//! `disable-mrt-writes` (strong-consistency namespaces only; elsewhere
//! the CE reference's answer, `ERROR:4:invalid set-config parameter`).
//!
//! Invariant: a request reaches the transaction path only on a namespace
//! `citrine_data::txn::allowed` accepts (strong consistency); everything
//! here only refuses or reports.

use crate::Layers;
use citrine_data::txn::{allowed, TxnPart, TxnRead, TxnWrite, Version, DURATION_MAX, DURATION_MIN};
use citrine_data::Namespace;
use citrine_index::RecordMeta;
use citrine_types::ResultCode;
use citrine_wire::info::InfoCommand;
use citrine_wire::msg::Field;
use std::sync::atomic::Ordering;

/// The `set-config` parameters of transactions.
const SETTINGS: [&str; 2] = ["mrt-duration", "disable-mrt-writes"];

/// Whether a `set-config:context=namespace` command sets a transaction
/// setting.
pub(crate) fn sets(command: &InfoCommand<'_>) -> bool {
    command
        .params
        .iter()
        .any(|(name, _)| SETTINGS.contains(name))
}

/// `set-config:context=namespace;id=NS;mrt-duration=S` and/or
/// `disable-mrt-writes=BOOL`: every value checked before any is applied.
pub(crate) fn set_config(layers: &Layers<'_>, command: &InfoCommand<'_>) -> String {
    let refused = || "ERROR:4:invalid set-config parameter".to_owned();
    let Some(namespace) = command
        .param("id")
        .and_then(|name| layers.namespace(name.as_bytes()))
    else {
        return "ERROR:4:namespace not found".to_owned();
    };
    if !allowed(namespace) {
        return refused();
    }
    let (mut duration, mut disabled) = (None, None);
    for (name, value) in &command.params {
        match *name {
            "context" | "id" => {}
            "mrt-duration" => match value.parse::<u32>() {
                Ok(seconds) if (DURATION_MIN..=DURATION_MAX).contains(&seconds) => {
                    duration = Some(seconds)
                }
                _ => return refused(),
            },
            "disable-mrt-writes" => match *value {
                "true" => disabled = Some(true),
                "false" => disabled = Some(false),
                _ => return refused(),
            },
            _ => return refused(),
        }
    }
    let tables = &namespace.txn;
    if let Some(seconds) = duration {
        tables.duration_seconds.store(seconds, Ordering::Relaxed);
    }
    if let Some(disabled) = disabled {
        tables.writes_disabled.store(disabled, Ordering::Relaxed);
    }
    tracing::info!(namespace = %namespace.config.name, ?duration, ?disabled, "transaction settings changed");
    "ok".to_owned()
}

/// The transaction part of a batch row's fields.
pub(crate) fn row_part<'a, I>(fields: impl Fn() -> I) -> TxnPart
where
    I: Iterator<Item = (u8, &'a [u8])>,
{
    TxnPart::of(|| fields().map(|(field_type, data)| Field { field_type, data }))
}

/// Whether a record UDF call is refused for carrying a transaction id
/// where no transactions run (25, as the CE reference answers).
pub(crate) fn refuses_udf(namespace: &Namespace, part: &TxnPart) -> bool {
    part.carries_id && !allowed(namespace)
}

/// A transaction's own version of a record: its metadata and body, or
/// `None` for its own removal.
pub(crate) type OwnVersion = Option<(RecordMeta, Vec<u8>)>;

/// The record a UDF inside a transaction starts from when the
/// transaction holds it: `Some(None)` for its own removal, `Some(Some(..))`
/// for its own version; `None` to read the committed record (outside a
/// transaction, or not held). A record another transaction holds refuses
/// a transaction's UDF (120). Called under the partition's read lock.
pub(crate) fn udf_base(
    namespace: &Namespace,
    request: &citrine_data::record::Request<'_>,
) -> Result<Option<OwnVersion>, ResultCode> {
    match citrine_data::txn::read_source(namespace, request) {
        Ok(TxnRead::Own { meta, body }) => Ok(Some(Some((meta, body)))),
        Err(ResultCode::NotFound) => Ok(Some(None)),
        Err(code) => Err(code),
        Ok(TxnRead::Plain | TxnRead::Committed) => Ok(None),
    }
}

/// The metadata of the version a transaction's UDF write compares with:
/// `Some(..)` when the transaction holds the record (its own version, or
/// `None` for its own removal), `None` to compare with the committed one.
pub(crate) fn udf_own_meta(txn: Option<&TxnWrite>) -> Option<Option<RecordMeta>> {
    match txn?.own.as_ref()? {
        Version::Store { meta, .. } => Some(Some(*meta)),
        Version::Delete => Some(None),
    }
}

/// `namespace/NS` statistics of `namespace`'s transactions.
pub(crate) fn stat_pairs(namespace: &Namespace) -> Vec<(String, String)> {
    citrine_data::txn::stat_pairs(namespace)
}
