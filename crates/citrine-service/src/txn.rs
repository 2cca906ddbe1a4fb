//! Multi-record transactions as the service meets them, around the data
//! layer's [`citrine_data::txn`] (which owns the transaction path itself).
//!
//! Owns: the reference's answer to a batch with a transaction in it on a
//! namespace that runs none (the whole batch answers 25, as the CE
//! reference answers; a row's version or deadline field alone is
//! ignored), the refusal of record UDFs inside a transaction (25: not
//! built yet), and the transaction statistics of `namespace/NS`.
//!
//! Invariant: a request reaches the transaction path only on a namespace
//! `citrine_data::txn::allowed` accepts (strong consistency); everything
//! here only refuses or reports.

use crate::batch::{Parent, RowReader};
use crate::Layers;
use citrine_data::txn::{allowed, TxnPart};
use citrine_data::Namespace;
use citrine_types::ResultCode;
use citrine_wire::msg::{field_type, Field};
use citrine_wire::txn::info4;

/// The code a whole batch answers when a row runs a transaction step on a
/// namespace that runs no transactions (or is unknown): 25.
pub(crate) fn batch_refusal(
    layers: Layers<'_>,
    payload: &[u8],
    parent: Parent,
    rows: u32,
) -> Option<ResultCode> {
    let mut reader = RowReader::new(payload, parent);
    for _ in 0..rows {
        let row = reader.next_row().ok()?;
        let body = &row.body;
        let transactional =
            body.header.info4 & info4::COMMIT_BITS != 0 || body.field(field_type::TXN_ID).is_some();
        let runs = body
            .field(field_type::NAMESPACE)
            .and_then(|name| layers.namespace(name))
            .is_some_and(allowed);
        if transactional && !runs {
            return Some(ResultCode::EnterpriseOnly);
        }
    }
    None
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
