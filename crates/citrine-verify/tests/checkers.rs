//! The checkers on hand-built histories: valid ones pass, and each broken
//! one fails for its own reason (the anomaly kind says which).

use citrine_verify::history::{Event, EventKind};
use citrine_verify::linear::Limits;
use citrine_verify::{check, AnomalyKind, Call, History, Outcome, Reply, Report, Status, Workload};
use std::time::{Duration, Instant};

/// Builds a history event by event, one tick apart.
#[derive(Default)]
struct Builder {
    events: Vec<Event>,
    next_op: usize,
}

impl Builder {
    fn push(&mut self, op: usize, process: u32, kind: EventKind) {
        let time_ns = self.events.len() as u64 * 1000;
        self.events.push(Event {
            time_ns,
            op,
            process,
            kind,
        });
    }

    fn invoke(&mut self, process: u32, key: &str, call: Call) -> (u32, usize) {
        let op = self.next_op;
        self.next_op += 1;
        let key = key.to_string();
        self.push(op, process, EventKind::Invoke { key, call });
        (process, op)
    }

    fn end(&mut self, (process, op): (u32, usize), outcome: Outcome) {
        self.push(op, process, EventKind::Complete(outcome));
    }

    fn ok(&mut self, handle: (u32, usize)) {
        self.end(handle, Outcome::Ok(Reply::Done));
    }

    fn read(&mut self, handle: (u32, usize), value: Option<i64>) {
        self.end(handle, Outcome::Ok(Reply::Value(value)));
    }

    /// A whole operation with nothing concurrent.
    fn done(&mut self, process: u32, key: &str, call: Call, outcome: Outcome) {
        let handle = self.invoke(process, key, call);
        self.end(handle, outcome);
    }

    fn history(self) -> History {
        History {
            events: self.events,
        }
    }
}

fn ok() -> Outcome {
    Outcome::Ok(Reply::Done)
}

fn saw(value: Option<i64>) -> Outcome {
    Outcome::Ok(Reply::Value(value))
}

fn limits() -> Limits {
    Limits {
        deadline: Instant::now() + Duration::from_secs(20),
        memory_bytes: 256 << 20,
    }
}

fn judge(workload: Workload, builder: Builder) -> Report {
    check(workload, &builder.history(), &limits())
}

fn assert_valid(report: &Report) {
    assert_eq!(report.status, Status::Valid, "{report:#?}");
}

fn assert_anomaly(report: &Report, kind: AnomalyKind) {
    assert_eq!(report.status, Status::Anomaly, "{report:#?}");
    assert!(report.has(kind), "expected {kind:?}: {report:#?}");
    assert!(
        report.anomalies.iter().all(|anomaly| anomaly.kind == kind),
        "only {kind:?} expected: {report:#?}"
    );
}

// ----- register -----

#[test]
fn register_sequential_and_overlapping_operations_are_linearizable() {
    let mut h = Builder::default();
    h.done(0, "a", Call::Read, saw(None));
    h.done(0, "a", Call::Write(1), ok());
    h.done(1, "a", Call::Cas { from: 1, to: 2 }, ok());
    // A write overlapping two reads: the first sees the old value, the
    // second the new one.
    let write = h.invoke(0, "a", Call::Write(3));
    let first = h.invoke(1, "a", Call::Read);
    h.read(first, Some(2));
    let second = h.invoke(2, "a", Call::Read);
    h.read(second, Some(3));
    h.ok(write);
    // A failed CAS takes no effect; another key is independent.
    h.done(
        1,
        "a",
        Call::Cas { from: 7, to: 4 },
        Outcome::Fail("generation".into()),
    );
    h.done(1, "a", Call::Read, saw(Some(3)));
    h.done(2, "b", Call::Write(4), ok());
    h.done(2, "b", Call::Read, saw(Some(4)));
    let report = judge(Workload::Register, h);
    assert_valid(&report);
}

#[test]
fn register_write_in_doubt_may_appear_late_or_never() {
    for later in [Some(5), Some(1)] {
        let mut h = Builder::default();
        h.done(0, "a", Call::Write(1), ok());
        h.done(1, "a", Call::Write(5), Outcome::Info("timeout".into()));
        h.done(0, "a", Call::Read, saw(Some(1)));
        h.done(0, "a", Call::Read, saw(later));
        assert_valid(&judge(Workload::Register, h));
    }
    // ...but once seen it cannot vanish again.
    let mut h = Builder::default();
    h.done(0, "a", Call::Write(1), ok());
    h.done(1, "a", Call::Write(5), Outcome::Info("timeout".into()));
    h.done(0, "a", Call::Read, saw(Some(5)));
    h.done(0, "a", Call::Read, saw(Some(1)));
    assert_anomaly(&judge(Workload::Register, h), AnomalyKind::NotLinearizable);
}

#[test]
fn register_stale_read_is_caught_with_its_smallest_witness() {
    let mut h = Builder::default();
    for value in 1..=6 {
        h.done(0, "a", Call::Write(value), ok());
        h.done(1, "a", Call::Read, saw(Some(value)));
    }
    // Read 2 after 6 was acknowledged: stale.
    h.done(2, "a", Call::Read, saw(Some(2)));
    let report = judge(Workload::Register, h);
    assert_anomaly(&report, AnomalyKind::NotLinearizable);
    let witness = &report.anomalies[0].witness;
    // write(2), the write(3) that made it stale, and the stale read.
    assert_eq!(witness.len(), 3, "{witness:#?}");
    assert!(witness[0].contains("write(2) ok"), "{witness:#?}");
    assert!(witness[1].contains("write(3) ok"), "{witness:#?}");
    assert!(witness[2].contains("p2 a read ok -> 2"), "{witness:#?}");
}

#[test]
fn register_lost_write_and_failed_cas_taking_effect_are_caught() {
    // An acknowledged write gone: the next read sees the record absent.
    let mut h = Builder::default();
    h.done(0, "a", Call::Write(3), ok());
    h.done(1, "a", Call::Read, saw(None));
    assert_anomaly(&judge(Workload::Register, h), AnomalyKind::NotLinearizable);
    // A CAS that failed definitely must not have written.
    let mut h = Builder::default();
    h.done(0, "a", Call::Write(1), ok());
    h.done(
        0,
        "a",
        Call::Cas { from: 1, to: 2 },
        Outcome::Fail("generation".into()),
    );
    h.done(1, "a", Call::Read, saw(Some(2)));
    assert_anomaly(&judge(Workload::Register, h), AnomalyKind::NotLinearizable);
    // A CAS acknowledged although the register did not hold its `from`.
    let mut h = Builder::default();
    h.done(0, "a", Call::Write(1), ok());
    h.done(0, "a", Call::Cas { from: 3, to: 4 }, ok());
    assert_anomaly(&judge(Workload::Register, h), AnomalyKind::NotLinearizable);
}

#[test]
fn register_search_bound_answers_unknown() {
    // Forty writes in doubt, then reads of each of their values in turn
    // and one more of the first, which nothing can explain: exhausting the
    // ways to interleave the writes needs far more than no time at all.
    let mut h = Builder::default();
    let writes: Vec<_> = (0..40)
        .map(|value| h.invoke(value, "a", Call::Write(i64::from(value))))
        .collect();
    for value in (0..40).chain([0]) {
        h.done(100, "a", Call::Read, saw(Some(value)));
    }
    for write in writes {
        h.end(write, Outcome::Info("timeout".into()));
    }
    let expired = Limits {
        deadline: Instant::now(),
        memory_bytes: usize::MAX,
    };
    let report = check(Workload::Register, &h.history(), &expired);
    assert_eq!(report.status, Status::Unknown, "{report:#?}");
    assert!(report.unknown[0].contains("time limit"), "{report:#?}");
}

// ----- counter -----

#[test]
fn counter_reads_within_bounds_are_valid() {
    let mut h = Builder::default();
    h.done(0, "c", Call::Read, saw(None));
    h.done(0, "c", Call::Add(1), ok());
    // A read concurrent with an add may see it or not.
    let read = h.invoke(1, "c", Call::Read);
    let add = h.invoke(0, "c", Call::Add(2));
    h.ok(add);
    h.read(read, Some(3));
    h.done(0, "c", Call::Add(4), Outcome::Info("timeout".into()));
    h.done(0, "c", Call::Add(8), Outcome::Fail("unavailable".into()));
    h.done(1, "c", Call::Read, saw(Some(3)));
    h.done(1, "c", Call::Read, saw(Some(7)));
    let report = judge(Workload::Counter, h);
    assert_valid(&report);
    assert!(
        report.summary[0].contains("2 acknowledged, 1 in doubt, 1 failed"),
        "{report:#?}"
    );
}

#[test]
fn counter_lost_increment_is_caught() {
    let mut h = Builder::default();
    h.done(0, "c", Call::Add(1), ok());
    h.done(0, "c", Call::Add(2), ok());
    h.done(1, "c", Call::Read, saw(Some(1)));
    let report = judge(Workload::Counter, h);
    assert_anomaly(&report, AnomalyKind::LostIncrement);
    assert!(
        report.anomalies[0].witness[0].contains("sum to 3"),
        "{report:#?}"
    );
}

#[test]
fn counter_read_beyond_every_attempt_is_caught() {
    // A failed add did not happen; a read that counts it is impossible.
    let mut h = Builder::default();
    h.done(0, "c", Call::Add(1), ok());
    h.done(0, "c", Call::Add(5), Outcome::Fail("unavailable".into()));
    h.done(1, "c", Call::Read, saw(Some(6)));
    assert_anomaly(&judge(Workload::Counter, h), AnomalyKind::ImpossibleRead);
}

// ----- set -----

fn elements(items: &[i64]) -> Outcome {
    Outcome::Ok(Reply::Elements(items.to_vec()))
}

#[test]
fn set_with_every_acknowledged_element_is_valid() {
    let mut h = Builder::default();
    h.done(0, "s", Call::Insert(1), ok());
    h.done(1, "s", Call::Insert(2), Outcome::Info("timeout".into()));
    h.done(1, "s", Call::Insert(3), Outcome::Info("timeout".into()));
    h.done(0, "s", Call::Insert(4), ok());
    h.done(2, "s", Call::ReadSet, elements(&[1, 3, 4]));
    let report = judge(Workload::Set, h);
    assert_valid(&report);
    assert!(
        report.summary[0].contains("2 acknowledged, 2 in doubt of which 1 recovered"),
        "{report:#?}"
    );
}

#[test]
fn set_anomalies_are_caught_each_for_its_reason() {
    let cases: [(&[i64], AnomalyKind); 3] = [
        (&[1], AnomalyKind::LostElement),
        (&[1, 2, 9], AnomalyKind::UnexpectedElement),
        (&[1, 2, 2], AnomalyKind::DuplicateElement),
    ];
    for (final_read, kind) in cases {
        let mut h = Builder::default();
        h.done(0, "s", Call::Insert(1), ok());
        h.done(0, "s", Call::Insert(2), ok());
        h.done(0, "s", Call::Insert(9), Outcome::Fail("unavailable".into()));
        h.done(1, "s", Call::ReadSet, elements(final_read));
        assert_anomaly(&judge(Workload::Set, h), kind);
    }
}

#[test]
fn set_without_a_final_read_is_undecided() {
    let mut h = Builder::default();
    h.done(0, "s", Call::Insert(1), ok());
    h.done(1, "s", Call::ReadSet, Outcome::Info("timeout".into()));
    let report = judge(Workload::Set, h);
    assert_eq!(report.status, Status::Unknown, "{report:#?}");
}

#[test]
fn wrong_operation_kind_is_a_malformed_history() {
    let mut h = Builder::default();
    h.done(0, "s", Call::Write(1), ok());
    assert_anomaly(&judge(Workload::Set, h), AnomalyKind::Malformed);
}

#[test]
fn register_unobserved_writes_in_doubt_are_set_aside() {
    // Sixty writes in doubt nobody read: set aside, the rest is easy.
    let mut h = Builder::default();
    let writes: Vec<_> = (0..60)
        .map(|value| h.invoke(value, "a", Call::Write(100 + i64::from(value))))
        .collect();
    h.done(100, "a", Call::Write(1), ok());
    h.done(100, "a", Call::Read, saw(Some(1)));
    for write in writes {
        h.end(write, Outcome::Info("timeout".into()));
    }
    let report = judge(Workload::Register, h);
    assert_valid(&report);
    assert!(report.summary[1].ends_with("set aside: 60"), "{report:#?}");
}
