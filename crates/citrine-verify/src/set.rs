//! The set checker: every acknowledged element is in the final read, and
//! the final read holds only elements some client tried to add, each once.
//!
//! Owns the per-key comparison. The final read of a key is its last
//! acknowledged `ReadSet` (the workload makes it after every client
//! stopped). Elements in doubt may be present or absent; they are counted
//! as recovered when present. A key with adds but no final read is
//! undecided.

use crate::history::{Call, History, Operation, Reply};
use crate::verdict::{AnomalyKind, KeyVerdict, Report};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What one key saw.
#[derive(Default)]
struct KeySet<'a> {
    acknowledged: BTreeSet<i64>,
    attempted: BTreeSet<i64>,
    final_read: Option<&'a Operation>,
}

/// How many elements an anomaly lists.
const WITNESSES: usize = 20;

/// Checks a set history.
pub fn check(history: &History) -> Report {
    let operations = match history.operations() {
        Ok(operations) => operations,
        Err(why) => return malformed(why),
    };
    let mut keys: BTreeMap<&str, KeySet> = BTreeMap::new();
    for operation in &operations {
        let key = keys.entry(operation.key.as_str()).or_default();
        match &operation.call {
            Call::Insert(element) => {
                if !operation.is_fail() {
                    key.attempted.insert(*element);
                }
                if operation.is_ok() {
                    key.acknowledged.insert(*element);
                }
            }
            Call::ReadSet => {
                let later = key
                    .final_read
                    .is_none_or(|read| read.complete < operation.complete);
                if operation.is_ok() && later {
                    key.final_read = Some(operation);
                }
            }
            call => return malformed(format!("{call:?} is not a set operation")),
        }
    }
    let mut totals = [0usize; 3];
    let verdicts = keys
        .into_iter()
        .flat_map(|(key, set)| judge(key, &set, &mut totals))
        .collect();
    let summary = vec![format!(
        "elements: {} acknowledged, {} in doubt of which {} recovered",
        totals[0], totals[1], totals[2]
    )];
    Report::from_verdicts(verdicts, summary)
}

/// The verdicts of one key; `totals` gains (acknowledged, in doubt, recovered).
fn judge(key: &str, set: &KeySet, totals: &mut [usize; 3]) -> Vec<KeyVerdict> {
    let Some(Reply::Elements(elements)) = set.final_read.and_then(Operation::reply) else {
        return vec![KeyVerdict::Unknown {
            key: key.to_string(),
            reason: "no final read succeeded".to_string(),
        }];
    };
    let mut counts: HashMap<i64, usize> = HashMap::new();
    for element in elements {
        *counts.entry(*element).or_default() += 1;
    }
    let doubt: BTreeSet<i64> = set
        .attempted
        .difference(&set.acknowledged)
        .copied()
        .collect();
    totals[0] += set.acknowledged.len();
    totals[1] += doubt.len();
    totals[2] += doubt
        .iter()
        .filter(|element| counts.contains_key(element))
        .count();
    let lost: Vec<i64> = set
        .acknowledged
        .iter()
        .filter(|element| !counts.contains_key(element))
        .copied()
        .collect();
    let mut unexpected: Vec<i64> = counts
        .keys()
        .filter(|element| !set.attempted.contains(element))
        .copied()
        .collect();
    unexpected.sort_unstable();
    let mut duplicated: Vec<i64> = counts
        .iter()
        .filter(|(_, count)| **count > 1)
        .map(|(element, _)| *element)
        .collect();
    duplicated.sort_unstable();
    let mut verdicts = Vec::new();
    for (kind, elements, what) in [
        (
            AnomalyKind::LostElement,
            lost,
            "acknowledged but missing from the final read",
        ),
        (
            AnomalyKind::UnexpectedElement,
            unexpected,
            "in the final read but never added",
        ),
        (
            AnomalyKind::DuplicateElement,
            duplicated,
            "present more than once",
        ),
    ] {
        if !elements.is_empty() {
            verdicts.push(KeyVerdict::anomaly(
                key,
                kind,
                format!("{} element(s) {what}: {}", elements.len(), list(&elements)),
                Vec::new(),
            ));
        }
    }
    if verdicts.is_empty() {
        verdicts.push(KeyVerdict::Valid {
            key: key.to_string(),
        });
    }
    verdicts
}

fn list(elements: &[i64]) -> String {
    let shown: Vec<String> = elements
        .iter()
        .take(WITNESSES)
        .map(i64::to_string)
        .collect();
    let more = elements.len().saturating_sub(WITNESSES);
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
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
