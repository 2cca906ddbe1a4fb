//! The counter checker: no acknowledged increment lost, no read of a value
//! that no set of attempted increments could produce.
//!
//! Owns the per-key bounds. Walking the history in order, for each key it
//! keeps the sum of increments acknowledged so far and the sum of
//! increments attempted so far (invoked and not definitely failed: ok, in
//! doubt, or never completed). A read must return at least the
//! acknowledged sum at its invocation (else an acknowledged increment was
//! lost) and at most the attempted sum at its completion (else it saw
//! increments that never happened). The workload's final read, made after
//! every client stopped, is one of these reads, so an acknowledged
//! increment missing at the end is caught too. Increments must be
//! positive (otherwise the bounds would not hold); an absent record reads 0.

use crate::history::{Call, EventKind, History, Outcome, Reply};
use crate::verdict::{AnomalyKind, KeyVerdict, Report};
use std::collections::{BTreeMap, HashMap};

/// Bounds kept per key.
#[derive(Default)]
struct Bounds {
    acknowledged: i64,
    attempted: i64,
    /// Lower bound of each outstanding read, by op id.
    read_floor: HashMap<usize, i64>,
    reads: usize,
    lost: Vec<String>,
    impossible: Vec<String>,
}

/// How many witnesses of one kind a report lists.
const WITNESSES: usize = 10;

/// Checks a counter history.
pub fn check(history: &History) -> Report {
    let operations = match history.operations() {
        Ok(operations) => operations,
        Err(why) => return malformed(why),
    };
    let by_id: HashMap<usize, &crate::history::Operation> = operations
        .iter()
        .map(|operation| (operation.id, operation))
        .collect();
    let mut keys: BTreeMap<&str, Bounds> = BTreeMap::new();
    let (mut acked, mut doubt, mut failed) = (0u64, 0u64, 0u64);
    for event in &history.events {
        let Some(operation) = by_id.get(&event.op) else {
            continue;
        };
        let bounds = keys.entry(operation.key.as_str()).or_default();
        match (&event.kind, &operation.call) {
            (EventKind::Invoke { .. }, Call::Add(delta)) => {
                if *delta <= 0 {
                    return malformed(format!(
                        "{}: increments must be positive",
                        operation.describe()
                    ));
                }
                if !operation.is_fail() {
                    bounds.attempted += delta;
                }
            }
            (EventKind::Invoke { .. }, Call::Read) => {
                bounds.read_floor.insert(operation.id, bounds.acknowledged);
            }
            (EventKind::Complete(outcome), Call::Add(delta)) => match outcome {
                Outcome::Ok(_) => {
                    bounds.acknowledged += delta;
                    acked += 1;
                }
                Outcome::Fail(_) => failed += 1,
                Outcome::Info(_) => doubt += 1,
            },
            (EventKind::Complete(Outcome::Ok(Reply::Value(seen))), Call::Read) => {
                judge_read(bounds, operation, seen.unwrap_or(0));
            }
            (EventKind::Complete(_), Call::Read) => {}
            (_, call) => return malformed(format!("{call:?} is not a counter operation")),
        }
    }
    let summary = vec![
        format!("increments: {acked} acknowledged, {doubt} in doubt, {failed} failed"),
        format!(
            "reads checked: {}",
            keys.values().map(|bounds| bounds.reads).sum::<usize>()
        ),
    ];
    Report::from_verdicts(verdicts(keys), summary)
}

fn judge_read(bounds: &mut Bounds, operation: &crate::history::Operation, value: i64) {
    bounds.reads += 1;
    let floor = bounds.read_floor.remove(&operation.id).unwrap_or(0);
    let ceiling = bounds.attempted;
    if value < floor && bounds.lost.len() < WITNESSES {
        bounds.lost.push(format!(
            "{}: increments acknowledged before it began sum to {floor}",
            operation.describe()
        ));
    }
    if value > ceiling && bounds.impossible.len() < WITNESSES {
        bounds.impossible.push(format!(
            "{}: every increment attempted before it returned sums to {ceiling}",
            operation.describe()
        ));
    }
}

fn verdicts(keys: BTreeMap<&str, Bounds>) -> Vec<KeyVerdict> {
    let mut verdicts = Vec::new();
    for (key, bounds) in keys {
        let before = verdicts.len();
        if !bounds.lost.is_empty() {
            verdicts.push(KeyVerdict::anomaly(
                key,
                AnomalyKind::LostIncrement,
                format!("a read returned less than the acknowledged increments ({} acknowledged in all)", bounds.acknowledged),
                bounds.lost,
            ));
        }
        if !bounds.impossible.is_empty() {
            verdicts.push(KeyVerdict::anomaly(
                key,
                AnomalyKind::ImpossibleRead,
                format!(
                    "a read returned more than every attempted increment ({} attempted in all)",
                    bounds.attempted
                ),
                bounds.impossible,
            ));
        }
        if verdicts.len() == before {
            verdicts.push(if bounds.reads == 0 {
                KeyVerdict::Unknown {
                    key: key.to_string(),
                    reason: "no read completed, so nothing could be checked".to_string(),
                }
            } else {
                KeyVerdict::Valid {
                    key: key.to_string(),
                }
            });
        }
    }
    verdicts
}

fn malformed(why: String) -> Report {
    Report::from_verdicts(
        vec![KeyVerdict::anomaly(
            "-",
            AnomalyKind::Malformed,
            why,
            Vec::new(),
        )],
        Vec::new(),
    )
}
