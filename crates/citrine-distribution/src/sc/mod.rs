//! Strong consistency (paper 000 §4; issue 39): the pure rules and their
//! wiring into the node's views.
//!
//! Modules: [`roster`] (the roster, pending roster and observed nodes of a
//! namespace, and the text of `roster:` / `roster-set:`) and
//! [`availability`] (roster placement, partition versions, the rules that
//! decide which sub-cluster serves a partition, its master, its regime,
//! and dead partitions). The property tests (`tests.rs`) drive both over
//! random splits, crashes, restarts and revives of rosters of 2 to 8 nodes,
//! seed by seed. [`store`] keeps the rosters cluster-wide and across
//! restarts (shared metadata, file `roster.smd`). [`partitions`] keeps
//! this node's partition versions (file `sc-versions`), exchanges them at
//! every view and publishes the SC partition map every member agrees on.
//! [`data_path`] applies that map on the request path (routing, replica
//! writes in the regime, read modes, unreplicated records).
//!
//! Invariants: except [`store`], [`partitions`] and [`data_path`], nothing here does I/O, reads a clock or
//! keeps state between calls beyond the values passed in; the same inputs
//! give the same answers on every node.

pub mod availability;
pub mod data_path;
pub mod partitions;
pub mod roster;
pub mod store;

#[cfg(test)]
mod tests;
