//! Multi-record transactions as the service meets them, around the data
//! layer's [`citrine_data::txn`] (which owns the transaction path itself).
//!
//! Owns: the transaction part of a batch row (each row runs the data
//! layer's path like a single-record request: where no transactions run,
//! a row with a transaction id or a verify or roll bit answers 25 and the
//! batch goes on, as the CE reference answers under respond-all-keys; a
//! version or deadline field alone is ignored), the refusal of record
//! UDFs inside a transaction (25: not built yet), and the transaction
//! statistics of `namespace/NS`.
//!
//! Invariant: a request reaches the transaction path only on a namespace
//! `citrine_data::txn::allowed` accepts (strong consistency); everything
//! here only refuses or reports.

use citrine_data::txn::TxnPart;
use citrine_data::Namespace;
use citrine_wire::msg::Field;

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
