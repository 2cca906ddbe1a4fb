//! Linearizability of one object's history: a depth-first search for a
//! legal sequential order (Wing & Gong), which linearizes an operation only
//! when its call is minimal in what is left (Lowe's just-in-time
//! linearization) and never explores a (set of linearized operations,
//! model state) configuration twice (the memoisation Porcupine uses).
//! A read-only operation (per [`Model::is_read_only`]) whose call is
//! minimal and that is legal in the current state is linearized at once and
//! never reordered: any legal completion that places it later can place it
//! now instead, so the 2^k orders of k concurrent reads are not explored.
//!
//! Owns the [`Model`] trait, the [`Entry`] form of an operation, the search
//! ([`check`]), its [`Limits`], and [`minimize`], which shrinks a failing
//! history to a small sub-history that still fails.
//!
//! The history is a sequence of call and return events; an entry's `call`
//! and `ret` are positions in one total order that agrees with real time.
//! An entry without a return is in doubt: it may be linearized at any
//! point after its call, or never (the search succeeds as soon as every
//! entry with a return is linearized). Invariants: the search answers
//! [`Linearity::Linearizable`] only with a witness order that the model
//! accepts and that respects real time, and [`Linearity::Not`] only after
//! exhausting every configuration; hitting a limit answers
//! [`Linearity::Unknown`], never a guess.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::Instant;

/// A sequential specification.
pub trait Model {
    /// The object's state (hashed for the memo).
    type State: Clone + Eq + Hash + Debug;
    /// One operation with what it observed.
    type Op: Debug;
    /// The state before any operation.
    fn init(&self) -> Self::State;
    /// The state after `op` takes effect in `state`, or `None` when `op`
    /// cannot take effect there with what it observed.
    fn step(&self, state: &Self::State, op: &Self::Op) -> Option<Self::State>;
    /// True when `op` leaves every state unchanged (a read). The search
    /// linearizes such an operation as soon as it is legal, without trying
    /// the orders that would place it later (they cannot succeed where
    /// this one fails).
    fn is_read_only(&self, _op: &Self::Op) -> bool {
        false
    }
}

/// One operation of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<O> {
    pub op: O,
    /// Position of the call.
    pub call: u64,
    /// Position of the return, after the call; `None` when in doubt.
    pub ret: Option<u64>,
}

/// Bounds of one search.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Give up (unknown) at this instant.
    pub deadline: Instant,
    /// Give up (unknown) when the memo would hold more than this many
    /// bytes (an estimate: the linearized set's words plus the state).
    pub memory_bytes: usize,
}

/// The search's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Linearity {
    /// A legal order exists: the entries' indices in that order (entries
    /// in doubt that never took effect are left out).
    Linearizable(Vec<usize>),
    /// No legal order exists. `longest` is the longest legal prefix the
    /// search found; `stuck` the last entry whose return the search reached
    /// before it could linearize it.
    Not {
        longest: Vec<usize>,
        stuck: Option<usize>,
    },
    /// A limit was hit first; the reason says which.
    Unknown(String),
}

/// The call and return events as a doubly linked list (dancing links:
/// a node taken out is put back in the reverse order).
struct Events {
    /// Node 0 is the head; node `1 + 2i` is entry i's call, `2 + 2i` its return.
    next: Vec<usize>,
    prev: Vec<usize>,
}

const NIL: usize = usize::MAX;

impl Events {
    fn new<O>(entries: &[Entry<O>]) -> Events {
        let mut order: Vec<(u64, usize)> = Vec::with_capacity(entries.len() * 2);
        for (index, entry) in entries.iter().enumerate() {
            order.push((entry.call, 1 + 2 * index));
            if let Some(ret) = entry.ret {
                order.push((ret, 2 + 2 * index));
            }
        }
        order.sort_unstable();
        let nodes = 1 + 2 * entries.len();
        let mut events = Events {
            next: vec![NIL; nodes],
            prev: vec![NIL; nodes],
        };
        let mut last = 0;
        for &(_, node) in &order {
            events.next[last] = node;
            events.prev[node] = last;
            last = node;
        }
        events
    }

    fn unlink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = next;
        if next != NIL {
            self.prev[next] = prev;
        }
    }

    fn relink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = node;
        if next != NIL {
            self.prev[next] = node;
        }
    }
}

/// A fixed-size bit set of linearized entries.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn set(&mut self, index: usize, on: bool) {
        let (word, bit) = (index / 64, 1u64 << (index % 64));
        if on {
            self.0[word] |= bit;
        } else {
            self.0[word] &= !bit;
        }
    }
}

/// One linearized entry on the search's stack.
struct Frame<S> {
    index: usize,
    /// The state before it.
    before: S,
    /// A read taken as soon as it was legal: the configuration before it
    /// has no other way forward, so backtracking goes past it.
    forced: bool,
}

/// What trying to linearize an entry did.
#[derive(PartialEq, Eq)]
enum Step {
    Taken,
    /// The model refuses it in this state.
    Illegal,
    /// The configuration it leads to was explored already (and failed).
    Seen,
}

/// The search's mutable state.
struct Search<'a, M: Model> {
    model: &'a M,
    entries: &'a [Entry<M::Op>],
    events: Events,
    bits: Bits,
    state: M::State,
    stack: Vec<Frame<M::State>>,
    memo: HashSet<(Bits, M::State)>,
    /// Entries with a return not yet linearized.
    pending: usize,
    longest: Vec<usize>,
    stuck: Option<usize>,
}

impl<M: Model> Search<'_, M> {
    /// Tries to linearize entry `index` now.
    fn try_linearize(&mut self, index: usize, forced: bool) -> Step {
        let Some(next) = self.model.step(&self.state, &self.entries[index].op) else {
            return Step::Illegal;
        };
        self.bits.set(index, true);
        if !self.memo.insert((self.bits.clone(), next.clone())) {
            self.bits.set(index, false);
            return Step::Seen;
        }
        let before = std::mem::replace(&mut self.state, next);
        self.stack.push(Frame {
            index,
            before,
            forced,
        });
        self.events.unlink(1 + 2 * index);
        if self.entries[index].ret.is_some() {
            self.events.unlink(2 + 2 * index);
            self.pending -= 1;
        }
        Step::Taken
    }

    /// In a fresh configuration: linearizes the first read whose call is
    /// minimal and that is legal now (`Taken`), or finds that doing so
    /// leads to an explored configuration, so this one fails too (`Seen`).
    fn force_read(&mut self) -> Step {
        let mut node = self.events.next[0];
        while node != NIL && !node.is_multiple_of(2) {
            let index = node / 2;
            if self.model.is_read_only(&self.entries[index].op) {
                match self.try_linearize(index, true) {
                    Step::Illegal => {}
                    taken_or_seen => return taken_or_seen,
                }
            }
            node = self.events.next[node];
        }
        Step::Illegal
    }

    /// Undoes linearizations up to and including the last one that was a
    /// choice; returns its node, to continue after it. `reached` is the
    /// entry whose return made the search turn back, if one did; it is
    /// kept as `stuck` with the longest prefix.
    fn backtrack(&mut self, reached: Option<usize>) -> Option<usize> {
        if self.stack.len() > self.longest.len() || self.stuck.is_none() {
            self.longest = self.stack.iter().map(|frame| frame.index).collect();
            self.stuck = reached.or(self.stuck);
        }
        loop {
            let frame = self.stack.pop()?;
            let index = frame.index;
            self.state = frame.before;
            self.bits.set(index, false);
            if self.entries[index].ret.is_some() {
                self.events.relink(2 + 2 * index);
                self.pending += 1;
            }
            self.events.relink(1 + 2 * index);
            if !frame.forced {
                return Some(1 + 2 * index);
            }
        }
    }
}

/// Searches for a linearization of `entries` from `model.init()`.
pub fn check<M: Model>(model: &M, entries: &[Entry<M::Op>], limits: &Limits) -> Linearity {
    let words = entries.len().div_ceil(64).max(1);
    let entry_bytes = words * 8 + std::mem::size_of::<M::State>() + 32;
    let mut search = Search {
        model,
        entries,
        events: Events::new(entries),
        bits: Bits(vec![0; words]),
        state: model.init(),
        stack: Vec::new(),
        memo: HashSet::new(),
        pending: entries.iter().filter(|entry| entry.ret.is_some()).count(),
        longest: Vec::new(),
        stuck: None,
    };
    let mut node = search.events.next[0];
    // True when the configuration is new: time to look for a forced read.
    let mut fresh = true;
    let mut steps: u64 = 0;
    loop {
        if search.pending == 0 {
            return Linearity::Linearizable(search.stack.iter().map(|frame| frame.index).collect());
        }
        steps += 1;
        if steps.is_multiple_of(4096) {
            if let Some(why) = over_limits(&search, steps, entry_bytes, limits) {
                return Linearity::Unknown(why);
            }
        }
        let forced = if fresh {
            search.force_read()
        } else {
            Step::Illegal
        };
        fresh = false;
        if forced == Step::Taken {
            node = search.events.next[0];
            fresh = true;
            continue;
        }
        // With entries still pending a return node is still linked, so the
        // walk meets it before the end; NIL here would be a broken list.
        if forced == Step::Seen || node == NIL || node.is_multiple_of(2) {
            let reached = (forced != Step::Seen && node != NIL).then(|| node / 2 - 1);
            match search.backtrack(reached) {
                Some(after) => node = search.events.next[after],
                None => {
                    return Linearity::Not {
                        longest: search.longest,
                        stuck: search.stuck,
                    }
                }
            }
        } else if search.try_linearize(node / 2, false) == Step::Taken {
            node = search.events.next[0];
            fresh = true;
        } else {
            node = search.events.next[node];
        }
    }
}

/// Why the search must stop now, if a limit is hit.
fn over_limits<M: Model>(
    search: &Search<'_, M>,
    steps: u64,
    entry_bytes: usize,
    limits: &Limits,
) -> Option<String> {
    if Instant::now() >= limits.deadline {
        return Some(format!("time limit reached after {steps} search steps"));
    }
    if search.memo.len().saturating_mul(entry_bytes) > limits.memory_bytes {
        return Some(format!(
            "memory limit reached: {} configurations memoised",
            search.memo.len()
        ));
    }
    None
}

/// Shrinks a history that `check` finds not linearizable to a sub-history
/// (indices into `entries`, ascending) that still is not: first the
/// shortest failing prefix in call order, then, until nothing changes,
/// without each entry whose removal keeps it failing and that
/// `may_remove(kept, entry)` allows (a model uses it to keep the writes
/// that a kept read observed, so the result does not degenerate into
/// "a read of a value nobody wrote"). Stops shrinking at
/// `limits.deadline` and returns the smallest failing set found so far.
pub fn minimize<M: Model>(
    model: &M,
    entries: &[Entry<M::Op>],
    limits: &Limits,
    may_remove: impl Fn(&[usize], usize) -> bool,
) -> Vec<usize>
where
    M::Op: Clone,
{
    let fails = |indices: &[usize]| {
        let subset: Vec<Entry<M::Op>> = indices.iter().map(|&i| entries[i].clone()).collect();
        matches!(check(model, &subset, limits), Linearity::Not { .. })
    };
    let mut by_call: Vec<usize> = (0..entries.len()).collect();
    by_call.sort_by_key(|&index| entries[index].call);
    let mut kept = shortest_failing_prefix(&by_call, &fails, limits);
    let mut changed = true;
    while changed && Instant::now() < limits.deadline {
        changed = false;
        // Latest first: the tail of a prefix is where the failure shows.
        let mut position = kept.len();
        while position > 0 && Instant::now() < limits.deadline {
            position -= 1;
            if !may_remove(&kept, kept[position]) {
                continue;
            }
            let mut without = kept.clone();
            without.remove(position);
            if fails(&without) {
                kept = without;
                changed = true;
            }
        }
    }
    kept.sort_unstable();
    kept
}

/// The shortest prefix of `by_call` that fails (binary search), or all of
/// it when the prefix found does not fail (failure need not be monotone in
/// the prefix: a later write can explain an earlier pending read).
fn shortest_failing_prefix(
    by_call: &[usize],
    fails: &impl Fn(&[usize]) -> bool,
    limits: &Limits,
) -> Vec<usize> {
    let (mut low, mut high) = (1, by_call.len());
    while low < high && Instant::now() < limits.deadline {
        let middle = (low + high) / 2;
        if fails(&by_call[..middle]) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    let prefix = &by_call[..high.min(by_call.len())];
    if fails(prefix) {
        prefix.to_vec()
    } else {
        by_call.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A register of small integers: read(v), write(v).
    struct Register;

    #[derive(Clone, Debug)]
    enum Op {
        Read(u8),
        Write(u8),
    }

    impl Model for Register {
        type State = u8;
        type Op = Op;
        fn init(&self) -> u8 {
            0
        }
        fn step(&self, state: &u8, op: &Op) -> Option<u8> {
            match *op {
                Op::Read(value) => (value == *state).then_some(*state),
                Op::Write(value) => Some(value),
            }
        }

        fn is_read_only(&self, op: &Op) -> bool {
            matches!(op, Op::Read(_))
        }
    }

    fn limits() -> Limits {
        Limits {
            deadline: Instant::now() + Duration::from_secs(10),
            memory_bytes: 64 << 20,
        }
    }

    fn entry(op: Op, call: u64, ret: Option<u64>) -> Entry<Op> {
        Entry { op, call, ret }
    }

    #[test]
    fn concurrent_read_may_see_either_value() {
        // write(1) overlaps a read of 1 and a later read of 0 would not be legal.
        let entries = vec![
            entry(Op::Write(1), 0, Some(3)),
            entry(Op::Read(1), 1, Some(2)),
            entry(Op::Read(0), 4, Some(5)),
        ];
        assert!(matches!(
            check(&Register, &entries, &limits()),
            Linearity::Not { .. }
        ));
        let entries = vec![
            entry(Op::Write(1), 0, Some(3)),
            entry(Op::Read(0), 1, Some(2)),
            entry(Op::Read(1), 4, Some(5)),
        ];
        assert_eq!(
            check(&Register, &entries, &limits()),
            Linearity::Linearizable(vec![1, 0, 2])
        );
    }

    #[test]
    fn an_entry_in_doubt_may_take_effect_late_or_never() {
        // write(2) never returned: a read long after may see 2, or 0.
        for seen in [2, 0] {
            let entries = vec![
                entry(Op::Write(2), 0, None),
                entry(Op::Read(seen), 10, Some(11)),
            ];
            assert!(matches!(
                check(&Register, &entries, &limits()),
                Linearity::Linearizable(_)
            ));
        }
        let entries = vec![
            entry(Op::Write(2), 0, None),
            entry(Op::Read(3), 10, Some(11)),
        ];
        assert!(matches!(
            check(&Register, &entries, &limits()),
            Linearity::Not { .. }
        ));
    }

    #[test]
    fn reads_legal_now_are_not_reordered() {
        // Forty overlapping reads of 1, then a read of a value never
        // written. Trying every subset of the reads before giving up would
        // take 2^40 steps; reads are taken as soon as they are legal.
        let mut entries = vec![entry(Op::Write(1), 0, Some(1))];
        entries.extend((0..40).map(|read| entry(Op::Read(1), 2 + read, Some(100 + read))));
        entries.push(entry(Op::Read(5), 200, Some(201)));
        let quick = Limits {
            deadline: Instant::now() + Duration::from_secs(2),
            memory_bytes: 64 << 20,
        };
        assert_eq!(
            check(&Register, &entries, &quick),
            Linearity::Not {
                longest: (0..41).collect(),
                stuck: Some(41)
            }
        );
    }

    #[test]
    fn limits_answer_unknown() {
        // Many overlapping writes and reads that never fit: the search
        // must explore a lot, and an expired deadline stops it.
        let mut entries: Vec<Entry<Op>> = (0..40)
            .map(|value| entry(Op::Write(value), u64::from(value), Some(1000)))
            .collect();
        entries.push(entry(Op::Read(200), 50, Some(60)));
        let expired = Limits {
            deadline: Instant::now(),
            memory_bytes: usize::MAX,
        };
        assert!(matches!(
            check(&Register, &entries, &expired),
            Linearity::Unknown(_)
        ));
        let tiny = Limits {
            deadline: Instant::now() + Duration::from_secs(10),
            memory_bytes: 1,
        };
        assert!(matches!(
            check(&Register, &entries, &tiny),
            Linearity::Unknown(_)
        ));
    }

    #[test]
    fn minimize_keeps_only_what_makes_it_fail() {
        // Twenty sequential good writes and reads, then a stale read of 3.
        let mut entries = Vec::new();
        for step in 0..20u8 {
            let at = u64::from(step) * 4;
            entries.push(entry(Op::Write(step + 1), at, Some(at + 1)));
            entries.push(entry(Op::Read(step + 1), at + 2, Some(at + 3)));
        }
        entries.push(entry(Op::Read(3), 100, Some(101)));
        // A write may go only if no kept read saw its value.
        let may_remove = |kept: &[usize], candidate: usize| match entries[candidate].op {
            Op::Read(_) => true,
            Op::Write(value) => !kept
                .iter()
                .any(|&other| matches!(entries[other].op, Op::Read(seen) if seen == value)),
        };
        let failing = minimize(&Register, &entries, &limits(), may_remove);
        // write(3), the write(4) that makes it stale, and the stale read.
        assert_eq!(failing, vec![4, 6, 40], "{failing:?}");
        // Without the constraint the read alone fails (3 is never written).
        assert_eq!(
            minimize(&Register, &entries, &limits(), |_, _| true),
            vec![40]
        );
    }
}
