//! The CAS register checker: each key's operations must be linearizable
//! against a register that starts absent (the workload uses fresh keys).
//!
//! Owns the register [`RegisterModel`] and the per-key check. What goes
//! into the search: acknowledged reads with the value they saw,
//! acknowledged writes and compare-and-sets, and writes and
//! compare-and-sets in doubt (they may take effect at any time after
//! their call, or never). Failed operations and reads that did not
//! complete are left out: they took no effect and observed nothing.
//! Writes in doubt whose value nothing observed are set aside first (see
//! [`set_aside_unobserved`] for why that is sound). A key whose history is
//! not linearizable is reported with its smallest failing sub-history
//! ([`crate::linear::minimize`]).

use crate::history::{Call, Operation, Reply};
use crate::linear::{self, Entry, Limits, Linearity, Model};
use crate::verdict::{AnomalyKind, KeyVerdict};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

/// A register operation with what it observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterOp {
    /// A read that returned this (`None`: no record).
    Read(Option<i64>),
    Write(i64),
    Cas {
        from: i64,
        to: i64,
    },
}

impl RegisterOp {
    /// The value this operation puts in the register, if it writes.
    fn produces(self) -> Option<i64> {
        match self {
            RegisterOp::Write(value) | RegisterOp::Cas { to: value, .. } => Some(value),
            RegisterOp::Read(_) => None,
        }
    }

    /// The value this operation needs to have been written before it.
    fn consumes(self) -> Option<i64> {
        match self {
            RegisterOp::Read(seen) => seen,
            RegisterOp::Cas { from, .. } => Some(from),
            RegisterOp::Write(_) => None,
        }
    }
}

/// A register that starts absent.
pub struct RegisterModel;

impl Model for RegisterModel {
    type State = Option<i64>;
    type Op = RegisterOp;

    fn init(&self) -> Option<i64> {
        None
    }

    fn step(&self, state: &Option<i64>, op: &RegisterOp) -> Option<Option<i64>> {
        match *op {
            RegisterOp::Read(seen) => (seen == *state).then_some(*state),
            RegisterOp::Write(value) => Some(Some(value)),
            RegisterOp::Cas { from, to } => (*state == Some(from)).then_some(Some(to)),
        }
    }

    fn is_read_only(&self, op: &RegisterOp) -> bool {
        matches!(op, RegisterOp::Read(_))
    }
}

/// The search entries of one key's operations (and the operation each
/// came from); `None` when an operation is malformed for a register.
fn entries_of<'a>(
    operations: &[&'a Operation],
) -> Result<(Vec<Entry<RegisterOp>>, Vec<&'a Operation>), String> {
    let mut entries = Vec::new();
    let mut sources = Vec::new();
    for &operation in operations {
        if operation.is_fail() {
            continue;
        }
        let ret = operation.complete.filter(|_| operation.is_ok());
        let op = match (&operation.call, operation.reply()) {
            (Call::Read, Some(Reply::Value(seen))) => RegisterOp::Read(*seen),
            // A read in doubt observed nothing.
            (Call::Read, None) => continue,
            (Call::Write(value), _) => RegisterOp::Write(*value),
            (Call::Cas { from, to }, _) => RegisterOp::Cas {
                from: *from,
                to: *to,
            },
            (call, reply) => {
                return Err(format!("{call:?} -> {reply:?} is not a register operation"))
            }
        };
        entries.push(Entry {
            op,
            call: operation.invoke as u64,
            ret: ret.map(|position| position as u64),
        });
        sources.push(operation);
    }
    Ok((entries, sources))
}

/// Checks every key's operations for linearizability within `limits`.
/// Each key gets an equal share of the time left (at least
/// [`MIN_KEY_TIME`], never past the deadline), so one hard key cannot
/// starve the others. Returns the verdicts and how many writes in doubt
/// were set aside as unobserved.
pub fn check(operations: &[Operation], limits: &Limits) -> (Vec<KeyVerdict>, usize) {
    let mut by_key: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for operation in operations {
        by_key.entry(&operation.key).or_default().push(operation);
    }
    let mut left = by_key.len();
    let mut set_aside = 0;
    let mut verdicts = Vec::with_capacity(left);
    for (key, operations) in by_key {
        let now = Instant::now();
        let share = limits.deadline.saturating_duration_since(now)
            / u32::try_from(left).unwrap_or(u32::MAX);
        let key_limits = Limits {
            deadline: (now + share.max(MIN_KEY_TIME)).min(limits.deadline),
            memory_bytes: limits.memory_bytes,
        };
        left -= 1;
        let (verdict, pruned) = check_key(key, &operations, &key_limits);
        verdicts.push(verdict);
        set_aside += pruned;
    }
    (verdicts, set_aside)
}

/// The least time a key's search gets (if the deadline allows).
pub const MIN_KEY_TIME: Duration = Duration::from_secs(2);

/// Removes, until none is left, writes in doubt whose value no operation
/// of the key observes (reads it, or expects it in a CAS). Sound: in any
/// legal order containing such a write, the next operation that depends
/// on the state is a write, so the order without it is legal too. It
/// spares the search the 2^k ways k unobserved writes in doubt can
/// interleave (the workload writes unique values, so most are unobserved).
fn set_aside_unobserved(
    entries: Vec<Entry<RegisterOp>>,
    sources: Vec<&Operation>,
) -> (Vec<Entry<RegisterOp>>, Vec<&Operation>, usize) {
    let (mut entries, mut sources, mut removed) = (entries, sources, 0);
    loop {
        let consumed: HashSet<i64> = entries
            .iter()
            .filter_map(|entry| entry.op.consumes())
            .collect();
        let keep: Vec<bool> = entries
            .iter()
            .map(|entry| {
                entry.ret.is_some()
                    || entry
                        .op
                        .produces()
                        .is_none_or(|value| consumed.contains(&value))
            })
            .collect();
        let dropped = keep.iter().filter(|kept| !**kept).count();
        if dropped == 0 {
            return (entries, sources, removed);
        }
        removed += dropped;
        let mut flags = keep.iter();
        entries.retain(|_| flags.next().copied().unwrap_or(true));
        let mut flags = keep.iter();
        sources.retain(|_| flags.next().copied().unwrap_or(true));
    }
}

fn check_key(key: &str, operations: &[&Operation], limits: &Limits) -> (KeyVerdict, usize) {
    let (entries, sources) = match entries_of(operations) {
        Ok(found) => found,
        Err(why) => {
            let verdict = KeyVerdict::anomaly(key, AnomalyKind::Malformed, why, Vec::new());
            return (verdict, 0);
        }
    };
    let (entries, sources, set_aside) = set_aside_unobserved(entries, sources);
    (judge(key, &entries, &sources, limits), set_aside)
}

fn judge(
    key: &str,
    entries: &[Entry<RegisterOp>],
    sources: &[&Operation],
    limits: &Limits,
) -> KeyVerdict {
    match linear::check(&RegisterModel, entries, limits) {
        Linearity::Linearizable(_) => KeyVerdict::Valid {
            key: key.to_string(),
        },
        Linearity::Unknown(why) => KeyVerdict::Unknown {
            key: key.to_string(),
            reason: why,
        },
        Linearity::Not { stuck, .. } => {
            let may_remove = |kept: &[usize], candidate: usize| removable(entries, kept, candidate);
            let failing = linear::minimize(&RegisterModel, entries, limits, may_remove);
            let lines = failing
                .iter()
                .map(|&index| sources[index].describe())
                .collect();
            let detail = match stuck {
                Some(stuck) => format!(
                    "no linearization of {} operations (the search got stuck at the return of {})",
                    entries.len(),
                    sources[stuck].describe()
                ),
                None => format!("no linearization of {} operations", entries.len()),
            };
            KeyVerdict::anomaly(key, AnomalyKind::NotLinearizable, detail, lines)
        }
    }
}

/// A write may leave the sub-history only if every value a kept operation
/// observed is still produced by another kept operation.
fn removable(entries: &[Entry<RegisterOp>], kept: &[usize], candidate: usize) -> bool {
    let Some(value) = entries[candidate].op.produces() else {
        return true;
    };
    let needed = kept
        .iter()
        .any(|&other| other != candidate && entries[other].op.consumes() == Some(value));
    let other_producer = kept
        .iter()
        .any(|&other| other != candidate && entries[other].op.produces() == Some(value));
    !needed || other_producer
}
