//! Multi-record transactions as the service meets them, around the data
//! layer's [`citrine_data::txn`] (which owns the transaction path itself).
//!
//! Owns: the transaction part of a batch row (each row runs the data
//! layer's path like a single-record request: where no transactions run,
//! a row with a transaction id or a verify or roll bit answers 25 and the
//! batch goes on, as the CE reference answers under respond-all-keys; a
//! version or deadline field alone is ignored), the refusal of record
//! UDFs inside a transaction (25: not built yet), the transaction
//! statistics of `namespace/NS`, and `set-config` of `mrt-duration` and
//! `disable-mrt-writes` (strong-consistency namespaces only; elsewhere
//! the CE reference's answer, `ERROR:4:invalid set-config parameter`).
//!
//! Invariant: a request reaches the transaction path only on a namespace
//! `citrine_data::txn::allowed` accepts (strong consistency); everything
//! here only refuses or reports.

use crate::Layers;
use citrine_data::txn::{allowed, TxnPart, DURATION_MAX, DURATION_MIN};
use citrine_data::Namespace;
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

/// Whether a record UDF call is refused for running inside a
/// transaction (25): UDFs in transactions are not built yet.
pub(crate) fn refuses_udf(part: &TxnPart) -> bool {
    part.carries_id
}

/// `namespace/NS` statistics of `namespace`'s transactions.
pub(crate) fn stat_pairs(namespace: &Namespace) -> Vec<(String, String)> {
    citrine_data::txn::stat_pairs(namespace)
}
