//! The history of a test run: every operation's invocation and completion,
//! in the order they happened.
//!
//! Owns [`Event`], [`History`], the [`Recorder`] concurrent clients write
//! into, and [`History::operations`], which pairs invocations with
//! completions. Invariants: events are totally ordered by their position in
//! [`History::events`], and that order agrees with real time (the
//! [`Recorder`] takes the timestamp and appends under one lock, so
//! `time_ns` never decreases along the vector); an operation is invoked
//! once and completed at most once, after its invocation; a process has at
//! most one operation outstanding. An operation that never completed is
//! treated like one that completed in doubt.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// What a client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// Read a register or a counter.
    Read,
    /// Write a register unconditionally.
    Write(i64),
    /// Compare-and-set a register: write `to` only if it holds `from`
    /// (a read, then a generation-checked write).
    Cas { from: i64, to: i64 },
    /// Add `delta` (positive) to a counter.
    Add(i64),
    /// Append an element to a set (a list bin).
    Insert(i64),
    /// Read every element of a set.
    ReadSet,
}

/// What an acknowledged operation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Nothing beyond the acknowledgement (writes).
    Done,
    /// A register or counter value; `None` when the record does not exist.
    Value(Option<i64>),
    /// A set's elements in stored order.
    Elements(Vec<i64>),
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged: it took effect, and returned this.
    Ok(Reply),
    /// A definite failure: it did not take effect.
    Fail(String),
    /// In doubt (a timeout, a broken connection): it may or may not have
    /// taken effect, now or later.
    Info(String),
}

impl Outcome {
    /// Short name as Jepsen writes it: `ok`, `fail` or `info`.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Ok(_) => "ok",
            Outcome::Fail(_) => "fail",
            Outcome::Info(_) => "info",
        }
    }
}

/// One entry of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Nanoseconds since the recorder started (monotonic clock).
    pub time_ns: u64,
    /// The operation this event belongs to.
    pub op: usize,
    /// The client (process) that ran it.
    pub process: u32,
    /// Invocation or completion.
    pub kind: EventKind,
}

/// Invocation or completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The client starts `call` on the record named `key`.
    Invoke { key: String, call: Call },
    /// The client learnt how it ended.
    Complete(Outcome),
}

/// One operation with both its ends, as [`History::operations`] pairs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    pub id: usize,
    pub process: u32,
    pub key: String,
    pub call: Call,
    /// Position of the invocation in [`History::events`].
    pub invoke: usize,
    /// Position of the completion (`None`: never completed).
    pub complete: Option<usize>,
    pub invoke_ns: u64,
    pub complete_ns: Option<u64>,
    /// `None`: never completed (as in doubt as [`Outcome::Info`]).
    pub outcome: Option<Outcome>,
}

impl Operation {
    /// True when it was acknowledged.
    pub fn is_ok(&self) -> bool {
        matches!(self.outcome, Some(Outcome::Ok(_)))
    }

    /// True when it definitely did not take effect.
    pub fn is_fail(&self) -> bool {
        matches!(self.outcome, Some(Outcome::Fail(_)))
    }

    /// The reply of an acknowledged operation.
    pub fn reply(&self) -> Option<&Reply> {
        match &self.outcome {
            Some(Outcome::Ok(reply)) => Some(reply),
            _ => None,
        }
    }

    /// One line for reports: `p3 r-0-2 cas(1,4) ok  [12.345 ms, 12.801 ms]`.
    pub fn describe(&self) -> String {
        let call = match &self.call {
            Call::Read => "read".to_string(),
            Call::Write(value) => format!("write({value})"),
            Call::Cas { from, to } => format!("cas({from},{to})"),
            Call::Add(delta) => format!("add({delta})"),
            Call::Insert(element) => format!("insert({element})"),
            Call::ReadSet => "read-set".to_string(),
        };
        let result = match &self.outcome {
            None => "never completed".to_string(),
            Some(Outcome::Ok(Reply::Done)) => "ok".to_string(),
            Some(Outcome::Ok(Reply::Value(Some(value)))) => format!("ok -> {value}"),
            Some(Outcome::Ok(Reply::Value(None))) => "ok -> nil".to_string(),
            Some(Outcome::Ok(Reply::Elements(items))) => format!("ok -> {} elements", items.len()),
            Some(Outcome::Fail(why)) => format!("fail ({why})"),
            Some(Outcome::Info(why)) => format!("info ({why})"),
        };
        let end = self.complete_ns.map_or_else(
            || "…".to_string(),
            |ns| format!("{:.3} ms", ns as f64 / 1e6),
        );
        format!(
            "p{} {} {call} {result}  [{:.3} ms, {end}]",
            self.process,
            self.key,
            self.invoke_ns as f64 / 1e6
        )
    }
}

/// The events of a run, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub events: Vec<Event>,
}

impl History {
    /// Pairs invocations with completions, in invocation order. Refuses a
    /// history that breaks the module's invariants (the message says where).
    pub fn operations(&self) -> Result<Vec<Operation>, String> {
        let mut operations: Vec<Operation> = Vec::new();
        let mut by_id: HashMap<usize, usize> = HashMap::new();
        let mut outstanding: HashMap<u32, usize> = HashMap::new();
        let mut last_ns = 0;
        for (position, event) in self.events.iter().enumerate() {
            if event.time_ns < last_ns {
                return Err(format!("event {position}: time goes backwards"));
            }
            last_ns = event.time_ns;
            match &event.kind {
                EventKind::Invoke { key, call } => {
                    if by_id.contains_key(&event.op) {
                        return Err(format!("event {position}: op {} invoked twice", event.op));
                    }
                    if let Some(other) = outstanding.insert(event.process, event.op) {
                        return Err(format!(
                            "event {position}: process {} invokes op {} while op {other} is outstanding",
                            event.process, event.op
                        ));
                    }
                    by_id.insert(event.op, operations.len());
                    operations.push(Operation {
                        id: event.op,
                        process: event.process,
                        key: key.clone(),
                        call: call.clone(),
                        invoke: position,
                        complete: None,
                        invoke_ns: event.time_ns,
                        complete_ns: None,
                        outcome: None,
                    });
                }
                EventKind::Complete(outcome) => {
                    let Some(&index) = by_id.get(&event.op) else {
                        return Err(format!(
                            "event {position}: op {} completes before it was invoked",
                            event.op
                        ));
                    };
                    let operation = &mut operations[index];
                    if operation.complete.is_some() || operation.process != event.process {
                        return Err(format!(
                            "event {position}: op {} completed twice or by another process",
                            event.op
                        ));
                    }
                    outstanding.remove(&event.process);
                    operation.complete = Some(position);
                    operation.complete_ns = Some(event.time_ns);
                    operation.outcome = Some(outcome.clone());
                }
            }
        }
        Ok(operations)
    }
}

/// Where concurrent clients record their operations.
pub struct Recorder {
    start: Instant,
    inner: Mutex<RecorderInner>,
}

#[derive(Default)]
struct RecorderInner {
    events: Vec<Event>,
    next_op: usize,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    /// An empty history starting now.
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            inner: Mutex::new(RecorderInner::default()),
        }
    }

    /// Records the invocation of `call` on `key` by `process`; returns the
    /// operation's id for [`Recorder::complete`].
    pub fn invoke(&self, process: u32, key: &str, call: Call) -> usize {
        self.push(|inner| {
            let op = inner.next_op;
            inner.next_op += 1;
            (
                op,
                process,
                EventKind::Invoke {
                    key: key.to_string(),
                    call,
                },
            )
        })
    }

    /// Records how operation `op` of `process` ended.
    pub fn complete(&self, process: u32, op: usize, outcome: Outcome) {
        self.push(|_| (op, process, EventKind::Complete(outcome)));
    }

    fn push(&self, make: impl FnOnce(&mut RecorderInner) -> (usize, u32, EventKind)) -> usize {
        // A poisoned lock only means another client panicked mid-push; the
        // vector itself is intact.
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let (op, process, kind) = make(&mut inner);
        // Taken under the lock, so times follow the order of the vector.
        let time_ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        inner.events.push(Event {
            time_ns,
            op,
            process,
            kind,
        });
        op
    }

    /// How many events so far.
    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    /// True before the first event.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the history so far.
    pub fn history(&self) -> History {
        History {
            events: self.lock().events.clone(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecorderInner> {
        self.inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_invocations_with_completions() {
        let recorder = Recorder::new();
        let a = recorder.invoke(0, "k", Call::Write(1));
        let b = recorder.invoke(1, "k", Call::Read);
        recorder.complete(1, b, Outcome::Ok(Reply::Value(Some(1))));
        recorder.complete(0, a, Outcome::Ok(Reply::Done));
        let c = recorder.invoke(0, "k", Call::Add(2));
        let operations = recorder.history().operations().expect("well formed");
        assert_eq!(operations.len(), 3);
        assert_eq!((operations[0].invoke, operations[0].complete), (0, Some(3)));
        assert_eq!((operations[1].invoke, operations[1].complete), (1, Some(2)));
        assert_eq!(operations[2].id, c);
        assert_eq!(operations[2].outcome, None, "never completed");
        assert!(operations[0].complete_ns >= Some(operations[1].invoke_ns));
    }

    #[test]
    fn refuses_malformed_histories() {
        let invoke = |op, process| Event {
            time_ns: 0,
            op,
            process,
            kind: EventKind::Invoke {
                key: "k".into(),
                call: Call::Read,
            },
        };
        let done = |op, process| Event {
            time_ns: 0,
            op,
            process,
            kind: EventKind::Complete(Outcome::Ok(Reply::Done)),
        };
        let two_outstanding = History {
            events: vec![invoke(0, 0), invoke(1, 0)],
        };
        assert!(two_outstanding.operations().is_err());
        let completes_first = History {
            events: vec![done(0, 0)],
        };
        assert!(completes_first.operations().is_err());
        let twice = History {
            events: vec![invoke(0, 0), done(0, 0), done(0, 0)],
        };
        assert!(twice.operations().is_err());
    }
}
