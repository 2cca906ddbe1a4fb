//! `citrine verify`'s engine: Jepsen-style workloads against a live
//! cluster that speaks the Aerospike client protocol (Citrine or
//! Aerospike), the history they record, and the checkers that judge it.
//!
//! Module map: [`history`] operations' invocations and completions and the
//! recorder concurrent clients share; [`linear`] the linearizability
//! search (Wing–Gong with Lowe's just-in-time linearization and a memo of
//! configurations) and failing-history minimization; [`register`] the CAS
//! register model and per-key check; [`counter`] and [`set`] their
//! checkers; [`verdict`] anomalies and the combined report; [`workload`]
//! the clients that drive a cluster and record the history.
//!
//! The checkers take only a [`history::History`], so a simulator or a
//! fault test can record its own and reuse them. Invariant: a checker
//! answers [`verdict::Status::Valid`] only when it decided every key, and
//! [`verdict::Status::Unknown`] (never a guess) when a bound was hit.

#![forbid(unsafe_code)]

pub mod counter;
pub mod history;
pub mod linear;
pub mod register;
pub mod set;
pub mod verdict;
pub mod workload;

pub use history::{Call, History, Outcome, Recorder, Reply};
pub use verdict::{AnomalyKind, Report, Status};
pub use workload::{Workload, WorkloadConfig};

use linear::Limits;

/// Checks a history of `workload` (register within `limits`; the counter
/// and set checkers run in linear time and need none).
pub fn check(workload: Workload, history: &History, limits: &Limits) -> Report {
    match workload {
        Workload::Register => check_register(history, limits),
        Workload::Counter => counter::check(history),
        Workload::Set => set::check(history),
    }
}

/// The register checker over a whole history.
pub fn check_register(history: &History, limits: &Limits) -> Report {
    let operations = match history.operations() {
        Ok(operations) => operations,
        Err(why) => {
            return Report::from_verdicts(
                vec![verdict::KeyVerdict::anomaly(
                    "-",
                    AnomalyKind::Malformed,
                    why,
                    Vec::new(),
                )],
                Vec::new(),
            )
        }
    };
    let count = |outcome: &str| {
        operations
            .iter()
            .filter(|operation| operation.outcome.as_ref().map_or("info", Outcome::name) == outcome)
            .count()
    };
    let (verdicts, set_aside) = register::check(&operations, limits);
    let summary = vec![
        format!(
            "operations: {} ok, {} in doubt, {} failed",
            count("ok"),
            count("info"),
            count("fail")
        ),
        format!("writes in doubt that nothing observed, set aside: {set_aside}"),
    ];
    Report::from_verdicts(verdicts, summary)
}
