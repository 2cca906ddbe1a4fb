//! Scan tests: request validation, partition selection, resume, set filter,
//! record limit, projections, expiry, and chunked streaming.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::batch::tests::{decode_stream, digest, put, put_blob, run, service, Msg, START_MS};
use crate::Service;
use std::collections::BTreeSet;

/// Options of a scan request.
#[derive(Default, Clone)]
struct ScanSpec {
    set: Option<&'static str>,
    pids: Option<Vec<u16>>,
    digests: Option<Vec<Digest>>,
    max_records: Option<u64>,
    bins: Vec<&'static str>,
    no_bins: bool,
    partition_done: bool,
    extra_fields: Vec<(u8, Vec<u8>)>,
    info2: u8,
    namespace: Option<&'static str>,
    /// Projected read ops after the bin names: (op type, bin, value).
    ops: Vec<(u8, &'static str, Vec<u8>)>,
    /// The task id (default: one of its own, as a client's request has:
    /// `query-show` refuses a scan reusing an active one's).
    trid: Option<u64>,
}

/// A task id no other request of these tests uses.
fn fresh_trid() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn scan_frame(spec: &ScanSpec) -> Vec<u8> {
    let mut out = Vec::new();
    let header = MsgHeader {
        info1: info1::READ | if spec.no_bins { info1::GET_NO_BINS } else { 0 },
        info2: spec.info2,
        info3: if spec.partition_done {
            info3::PARTITION_DONE
        } else {
            0
        },
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer.field(
        field_type::NAMESPACE,
        spec.namespace.unwrap_or("test").as_bytes(),
    );
    if let Some(set) = spec.set {
        writer.field(field_type::SET, set.as_bytes());
    }
    writer.field(field_type::SOCKET_TIMEOUT, &1000u32.to_be_bytes());
    let trid = spec.trid.unwrap_or_else(fresh_trid);
    writer.field(field_type::TASK_ID, &trid.to_be_bytes());
    for (kind, data) in &spec.extra_fields {
        writer.field(*kind, data);
    }
    if let Some(pids) = &spec.pids {
        let bytes: Vec<u8> = pids.iter().flat_map(|pid| pid.to_le_bytes()).collect();
        writer.field(field_type::PID_ARRAY, &bytes);
    }
    if let Some(digests) = &spec.digests {
        let bytes: Vec<u8> = digests.iter().flat_map(|digest| digest.0).collect();
        writer.field(field_type::DIGEST_ARRAY, &bytes);
    }
    if let Some(limit) = spec.max_records {
        writer.field(field_type::MAX_RECORDS, &limit.to_be_bytes());
    }
    for bin in &spec.bins {
        writer.op(op_type::READ, 0, bin.as_bytes(), b"");
    }
    for (op, bin, value) in &spec.ops {
        writer.op(*op, 0, bin.as_bytes(), value);
    }
    writer.finish();
    out
}

fn scan(service: &Service, spec: ScanSpec) -> (Vec<Msg>, Msg) {
    let spec = ScanSpec {
        partition_done: true,
        ..spec
    };
    let mut messages = run(service, &scan_frame(&spec));
    let last = messages.pop().unwrap();
    assert_eq!(last.header.info3, info3::LAST);
    assert!(messages
        .iter()
        .all(|message| message.header.info3 == 0 && message.header.result_code == 0));
    (messages, last)
}

fn refused(service: &Service, spec: ScanSpec) -> u8 {
    let messages = run(service, &scan_frame(&spec));
    assert_eq!(messages.len(), 1, "a refusal is one message");
    assert_eq!(messages[0].header.info3, info3::LAST);
    messages[0].header.result_code
}

fn digest_of(message: &Msg) -> Digest {
    let mut bytes = [0u8; DIGEST_SIZE];
    bytes.copy_from_slice(message.field(field_type::DIGEST).unwrap());
    Digest(bytes)
}

/// 300 records: 200 in "demo" (keys stored for even ones), 100 in "other".
fn populated() -> (Service, Arc<crate::ManualClock>) {
    let (service, clock) = service();
    for key in 0..200 {
        put(
            &service,
            "demo",
            &format!("d{key}"),
            &[("n", key), ("m", -key)],
            key % 2 == 0,
        );
    }
    for key in 0..100 {
        put(&service, "other", &format!("o{key}"), &[("n", key)], false);
    }
    (service, clock)
}

#[test]
fn scans_every_record_with_metadata() {
    let (service, _) = populated();
    let (records, last) = scan(&service, ScanSpec::default());
    assert_eq!(last.header.result_code, 0);
    assert_eq!(records.len(), 300);
    let unique: BTreeSet<Digest> = records.iter().map(digest_of).collect();
    assert_eq!(unique.len(), 300);
    let d4 = records
        .iter()
        .find(|record| digest_of(record) == digest("demo", "d4"))
        .unwrap();
    assert_eq!(d4.field(field_type::NAMESPACE), Some(&b"test"[..]));
    assert_eq!(d4.field(field_type::SET), Some(&b"demo"[..]));
    assert_eq!(d4.field(field_type::KEY), Some(&b"\x03d4"[..]));
    assert_eq!(d4.header.generation, 1);
    assert_eq!(d4.bin("n"), Some(&4i64.to_be_bytes()[..]));
    assert_eq!(d4.bin("m"), Some(&(-4i64).to_be_bytes()[..]));
    assert!(d4.bins.iter().all(|(_, particle, _)| *particle == 1));
    let d5 = records
        .iter()
        .find(|record| digest_of(record) == digest("demo", "d5"))
        .unwrap();
    assert_eq!(d5.field(field_type::KEY), None, "key not stored");
    // Ascending partitions, ascending digests within each partition.
    let order: Vec<(u16, Digest)> = records
        .iter()
        .map(|record| (digest_of(record).partition().get(), digest_of(record)))
        .collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted);
    assert_eq!(service.stats.scan.records.load(Ordering::Relaxed), 300);
}

#[test]
fn pid_subset_returns_only_those_partitions() {
    let (service, _) = populated();
    let wanted: Vec<u16> = vec![
        digest("demo", "d1").partition().get(),
        digest("other", "o7").partition().get(),
        4095,
    ];
    let (records, _) = scan(
        &service,
        ScanSpec {
            pids: Some(wanted.clone()),
            ..ScanSpec::default()
        },
    );
    assert!(!records.is_empty());
    assert!(records
        .iter()
        .all(|record| wanted.contains(&digest_of(record).partition().get())));
    assert!(records
        .iter()
        .any(|record| digest_of(record) == digest("demo", "d1")));
    assert!(records
        .iter()
        .any(|record| digest_of(record) == digest("other", "o7")));
    // Exactly the records of those partitions.
    let (all, _) = scan(&service, ScanSpec::default());
    let expected = all
        .iter()
        .filter(|record| wanted.contains(&digest_of(record).partition().get()))
        .count();
    assert_eq!(records.len(), expected);
}

#[test]
fn resume_after_digest_continues_strictly_after_it() {
    let (service, _) = service();
    // Many records so that one partition holds several.
    for key in 0..20_000 {
        put(&service, "demo", &format!("r{key}"), &[("n", key)], false);
    }
    let (all, _) = scan(&service, ScanSpec::default());
    assert_eq!(all.len(), 20_000);
    let target = digest_of(&all[0]).partition();
    let in_partition: Vec<Digest> = all
        .iter()
        .map(digest_of)
        .filter(|digest| digest.partition() == target)
        .collect();
    assert!(in_partition.len() >= 3, "{}", in_partition.len());
    for cut in 0..in_partition.len() {
        let (records, _) = scan(
            &service,
            ScanSpec {
                digests: Some(vec![in_partition[cut]]),
                ..ScanSpec::default()
            },
        );
        let got: Vec<Digest> = records.iter().map(digest_of).collect();
        assert_eq!(got, in_partition[cut + 1..].to_vec(), "cut {cut}");
    }
    // A resume digest that no longer exists still resumes after its place.
    let mut ghost = in_partition[1];
    ghost.0[19] = ghost.0[19].wrapping_add(1);
    let (records, _) = scan(
        &service,
        ScanSpec {
            digests: Some(vec![ghost]),
            ..ScanSpec::default()
        },
    );
    assert!(records.iter().all(|record| digest_of(record) > ghost));
    // PIDs and digests together.
    let other = digest_of(all.last().unwrap()).partition();
    let (records, _) = scan(
        &service,
        ScanSpec {
            pids: Some(vec![other.get()]),
            digests: Some(vec![in_partition[0]]),
            ..ScanSpec::default()
        },
    );
    let expected = in_partition.len() - 1
        + all
            .iter()
            .filter(|record| digest_of(record).partition() == other)
            .count();
    assert_eq!(records.len(), expected);
}

#[test]
fn set_filter_and_unknown_set() {
    let (service, _) = populated();
    let (records, _) = scan(
        &service,
        ScanSpec {
            set: Some("other"),
            ..ScanSpec::default()
        },
    );
    assert_eq!(records.len(), 100);
    assert!(records
        .iter()
        .all(|record| record.field(field_type::SET) == Some(&b"other"[..])));
    let (records, last) = scan(
        &service,
        ScanSpec {
            set: Some("nosuchset"),
            ..ScanSpec::default()
        },
    );
    assert!(records.is_empty());
    assert_eq!(last.header.result_code, 0);
}

#[test]
fn a_filter_expression_returns_only_the_records_it_passes() {
    let (service, _) = populated();
    // [GE, [BIN, INT, "n"], 150]: true for d150..d199; "other" holds n < 100.
    let filter = [0x93, 0x04, 0x93, 0x51, 0x02, 0xA1, b'n', 0xCC, 150];
    let (records, last) = scan(
        &service,
        ScanSpec {
            extra_fields: vec![(field_type::FILTER_EXPRESSION, filter.to_vec())],
            partition_done: true,
            ..ScanSpec::default()
        },
    );
    assert_eq!(last.header.result_code, 0);
    assert_eq!(records.len(), 50);
    assert!(records.iter().all(|record| {
        let n = i64::from_be_bytes(record.bin("n").unwrap().try_into().unwrap());
        (150..200).contains(&n)
    }));
    // A record without the bin is "unknown": not returned either.
    // [LT, [BIN, INT, "m"], 0]: only "demo" has bin m (0, -1, ..., -199).
    let filter = [0x93, 0x05, 0x93, 0x51, 0x02, 0xA1, b'm', 0x00];
    let (records, _) = scan(
        &service,
        ScanSpec {
            extra_fields: vec![(field_type::FILTER_EXPRESSION, filter.to_vec())],
            partition_done: true,
            ..ScanSpec::default()
        },
    );
    assert_eq!(records.len(), 199);
}

#[test]
fn max_records_limits_the_stream() {
    let (service, _) = populated();
    for limit in [1, 7, 299, 300, 1000] {
        let (records, last) = scan(
            &service,
            ScanSpec {
                max_records: Some(limit),
                ..ScanSpec::default()
            },
        );
        assert_eq!(records.len() as u64, limit.min(300));
        assert_eq!(last.header.result_code, 0);
    }
}

#[test]
fn no_bins_and_projection() {
    let (service, _) = populated();
    let (records, _) = scan(
        &service,
        ScanSpec {
            set: Some("demo"),
            no_bins: true,
            ..ScanSpec::default()
        },
    );
    assert_eq!(records.len(), 200);
    assert!(records.iter().all(|record| record.bins.is_empty()
        && record.header.generation == 1
        && record.field(field_type::DIGEST).is_some()));
    let (records, _) = scan(
        &service,
        ScanSpec {
            set: Some("demo"),
            bins: vec!["m", "absent"],
            ..ScanSpec::default()
        },
    );
    assert_eq!(records.len(), 200);
    assert!(records
        .iter()
        .all(|record| record.bins.len() == 1 && record.bin("m").is_some()));
}

/// A record that holds none of the projected bins is left out (as the
/// reference leaves it out), and does not count against the record limit.
#[test]
fn a_projection_leaves_out_the_records_holding_none_of_its_bins() {
    let (service, _) = populated();
    let projected = |bins: Vec<&'static str>, max_records: Option<u64>| {
        scan(
            &service,
            ScanSpec {
                bins,
                max_records,
                ..ScanSpec::default()
            },
        )
        .0
    };
    // Only the 200 records of "demo" hold bin "m".
    let records = projected(vec!["m"], None);
    assert_eq!(records.len(), 200);
    assert!(records.iter().all(|record| record.bin("m").is_some()));
    assert_eq!(projected(vec!["m", "absent"], None).len(), 200);
    assert_eq!(projected(vec!["n"], None).len(), 300);
    assert!(projected(vec!["absent"], None).is_empty());
    let limited = projected(vec!["m"], Some(150));
    assert_eq!(limited.len(), 150);
    assert!(limited.iter().all(|record| record.bin("m").is_some()));
    // Metadata only: every record, whatever it holds.
    let (records, _) = scan(
        &service,
        ScanSpec {
            bins: vec!["absent"],
            no_bins: true,
            ..ScanSpec::default()
        },
    );
    assert_eq!(records.len(), 300);
}

/// With `RESPOND_ALL_OPS` each projected op answers on every record, a nil
/// where it has nothing; a record an op fails on (a list op on an integer)
/// is left out either way. As the reference answers.
#[test]
fn projected_ops_answer_nil_when_asked_for_all_and_a_failing_op_drops_its_record() {
    let (service, _) = service();
    let mut out = Vec::new();
    let header = MsgHeader {
        info2: info2::WRITE,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"mixed")
        .field(field_type::DIGEST, &digest("mixed", "list").0);
    // A list [1, 2] (particle type 20, msgpack).
    writer.op(op_type::WRITE, 20, b"l", &[0x92, 0x01, 0x02]);
    writer.finish();
    assert_eq!(run(&service, &out)[0].header.result_code, 0);
    put(&service, "mixed", "int", &[("l", 5)], false);
    put(&service, "mixed", "none", &[("x", 1)], false);
    // [SIZE] (list op 16).
    let size = (op_type::CDT_READ, "l", vec![0x91, 0x10]);
    let projected = |info2: u8, ops: Vec<(u8, &'static str, Vec<u8>)>| {
        let (records, _) = scan(
            &service,
            ScanSpec {
                set: Some("mixed"),
                info2,
                ops,
                ..ScanSpec::default()
            },
        );
        let mut answers: Vec<Vec<(String, u8, Vec<u8>)>> = records
            .iter()
            .map(|record| {
                record
                    .bins
                    .iter()
                    .map(|(name, particle, value)| {
                        (
                            String::from_utf8_lossy(name).into_owned(),
                            *particle,
                            value.clone(),
                        )
                    })
                    .collect()
            })
            .collect();
        answers.sort();
        answers
    };
    let two = 2i64.to_be_bytes().to_vec();
    assert_eq!(
        projected(0, vec![size.clone()]),
        vec![vec![("l".to_owned(), 1, two.clone())]]
    );
    assert_eq!(
        projected(info2::RESPOND_ALL_OPS, vec![size.clone()]),
        vec![
            vec![("l".to_owned(), 0, vec![])],
            vec![("l".to_owned(), 1, two.clone())],
        ]
    );
    // A bin read answers a nil too when asked for all.
    assert_eq!(
        projected(info2::RESPOND_ALL_OPS, vec![(op_type::READ, "x", vec![])]).len(),
        3
    );
    assert_eq!(projected(0, vec![(op_type::READ, "x", vec![])]).len(), 1);
}

/// Registers `sum.lua`: `sum_m` sums bin `m` of the records its stream
/// gets, `count` counts them.
fn put_sum_module(service: &Service) {
    use base64::Engine as _;
    let source = "local function plus(a, b) return a + b end\n\
        function sum_m(stream) return stream : map(function(rec) return rec['m'] end) : reduce(plus) end\n\
        function count(stream) return stream : map(function(rec) return 1 end) : reduce(plus) end\n";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    let answers = crate::tests::info(
        service,
        &[&format!("udf-put:filename=sum.lua;content={content};")],
    );
    assert_eq!(answers[0].1, "ok");
}

/// An aggregation of `function` over `set`, with the bins a client
/// selected and an index range, if any: its result code and the values
/// its stream emitted (one per partition).
fn aggregate(
    service: &Service,
    set: &'static str,
    function: &str,
    bins: Vec<&'static str>,
    range: Option<Vec<u8>>,
) -> (u8, Vec<i64>) {
    let mut extra_fields = vec![
        (field_type::UDF_OP, vec![udf_op::AGGREGATE]),
        (field_type::UDF_FILENAME, b"sum".to_vec()),
        (field_type::UDF_FUNCTION, function.as_bytes().to_vec()),
        (field_type::UDF_ARGLIST, vec![0x90]),
    ];
    extra_fields.extend(range.map(|range| (field_type::INDEX_RANGE, range)));
    let mut messages = run(
        service,
        &scan_frame(&ScanSpec {
            set: Some(set),
            bins,
            extra_fields,
            ..ScanSpec::default()
        }),
    );
    let last = messages.pop().unwrap();
    assert_eq!(last.header.info3, info3::LAST);
    let values = messages
        .iter()
        .filter_map(|message| message.bin("SUCCESS"))
        .map(|value| i64::from_be_bytes(value.try_into().unwrap()))
        .collect();
    (last.header.result_code, values)
}

/// An aggregation that also selects bins runs (the reference runs it), and
/// its stream sees whole records, not just the bins selected.
#[test]
fn an_aggregation_selecting_bins_sees_whole_records() {
    let (service, _) = populated();
    put_sum_module(&service);
    let expected: i64 = (0..200).map(|key: i64| -key).sum();
    let (code, values) = aggregate(&service, "demo", "sum_m", vec!["n"], None);
    assert_eq!(code, 0);
    assert_eq!(values.iter().sum::<i64>(), expected);
    // Selected bins that no record holds leave no record out either.
    let (code, values) = aggregate(&service, "demo", "count", vec!["absent"], None);
    assert_eq!((code, values.iter().sum::<i64>()), (0, 200));
    // With an index filter.
    assert_eq!(
        crate::tests::info(
            &service,
            &["sindex-create:ns=test;set=demo;indexname=n;bin=n;type=NUMERIC"]
        )[0]
        .1,
        "ok"
    );
    let range = crate::sindex::tests::int_range("n", 10, 19);
    let (code, values) = aggregate(&service, "demo", "sum_m", vec!["n"], Some(range));
    assert_eq!((code, values.iter().sum::<i64>()), (0, -145));
}

/// An aggregation over a set never written answers success with nothing,
/// whether or not its filter has an index; over a set that exists, a
/// filter without an index answers 201 (the reference's answers).
#[test]
fn an_aggregation_over_a_set_never_written_selects_nothing() {
    let (service, _) = populated();
    put_sum_module(&service);
    let unindexed = || Some(crate::sindex::tests::int_range("n", 0, 10));
    assert_eq!(
        aggregate(&service, "never", "count", vec![], unindexed()),
        (0, vec![])
    );
    assert_eq!(
        aggregate(&service, "never", "count", vec!["n"], None),
        (0, vec![])
    );
    assert_eq!(
        aggregate(&service, "demo", "count", vec![], unindexed()),
        (201, vec![])
    );
    // A plain query over a set never written still needs its index.
    assert_eq!(
        refused(
            &service,
            ScanSpec {
                set: Some("never"),
                partition_done: true,
                extra_fields: vec![(field_type::INDEX_RANGE, unindexed().unwrap())],
                ..ScanSpec::default()
            }
        ),
        201
    );
}

#[test]
fn expired_and_truncated_records_are_skipped() {
    let (service, clock) = service();
    let mut out = Vec::new();
    // A record with a 10 s TTL.
    let header = MsgHeader {
        info2: info2::WRITE,
        record_ttl: 10,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, b"demo")
        .field(field_type::DIGEST, &digest("demo", "short").0);
    writer.op(op_type::WRITE, 1, b"n", &1i64.to_be_bytes());
    writer.finish();
    assert_eq!(run(&service, &out)[0].header.result_code, 0);
    put(&service, "demo", "long", &[("n", 2)], false);
    let (records, _) = scan(&service, ScanSpec::default());
    assert_eq!(records.len(), 2);
    let short = records
        .iter()
        .find(|record| digest_of(record) == digest("demo", "short"))
        .unwrap();
    assert!(short.header.record_ttl > 0, "void time is sent");
    clock.advance_ms(11_000);
    let (records, _) = scan(&service, ScanSpec::default());
    assert_eq!(records.len(), 1);
    // Truncate the namespace: everything older disappears.
    clock.advance_ms(1);
    service
        .namespace(b"test")
        .unwrap()
        .stats
        .truncate_lut_ms
        .store(START_MS + 11_001, Ordering::Relaxed);
    let (records, _) = scan(&service, ScanSpec::default());
    assert!(records.is_empty());
}

#[test]
fn refusals() {
    let (service, _) = populated();
    let base = ScanSpec {
        partition_done: true,
        ..ScanSpec::default()
    };
    // Legacy scan without PARTITION_DONE.
    assert_eq!(refused(&service, ScanSpec::default()), 16);
    let with = |kind: u8, data: &[u8]| ScanSpec {
        extra_fields: vec![(kind, data.to_vec())],
        ..base.clone()
    };
    let range = [
        1u8, 1, b'n', 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 9,
    ];
    assert_eq!(
        refused(&service, with(field_type::INDEX_RANGE, &range)),
        201
    );
    // An index name with no range to look up: a scan, as the reference
    // decides by INDEX_RANGE alone.
    let (records, last) = scan(&service, with(field_type::INDEX_NAME, b"idx"));
    assert_eq!((records.len(), last.header.result_code), (300, 0));
    // An aggregation without a module and function.
    assert_eq!(refused(&service, with(field_type::UDF_OP, &[1])), 4);
    // A filter that does not parse: [EQ] with no operands.
    assert_eq!(
        refused(&service, with(field_type::FILTER_EXPRESSION, &[0x91, 0x01])),
        4
    );
    // A background scan with no ops to apply: 4 (see `job` for the rest).
    assert_eq!(
        refused(
            &service,
            ScanSpec {
                info2: info2::WRITE,
                bins: vec![],
                ..base.clone()
            }
        ),
        4
    );
    assert_eq!(
        refused(
            &service,
            ScanSpec {
                namespace: Some("nope"),
                ..base.clone()
            }
        ),
        20
    );
    let bad_pids: [&[u8]; 4] = [&[], &[1], &[0x00, 0x10], &[5, 0, 5, 0]];
    for pids in bad_pids {
        assert_eq!(
            refused(&service, with(field_type::PID_ARRAY, pids)),
            4,
            "{pids:?}"
        );
    }
    assert_eq!(
        refused(&service, with(field_type::DIGEST_ARRAY, &[0; 19])),
        4
    );
    // A digest in a partition that the PID list names too.
    let d = digest("demo", "d1");
    let mut both = base.clone();
    both.pids = Some(vec![d.partition().get()]);
    both.digests = Some(vec![d]);
    assert_eq!(refused(&service, both), 4);
    assert_eq!(refused(&service, with(field_type::MAX_RECORDS, &[0; 4])), 4);
    // A projected bin name longer than 15 bytes.
    let mut frame_spec = base.clone();
    frame_spec.bins = vec!["0123456789abcdefg"];
    assert_eq!(refused(&service, frame_spec), 21);
    // RECS_PER_SEC must be a u32.
    assert_eq!(
        refused(&service, with(field_type::RECORDS_PER_SECOND, &[0; 3])),
        4
    );
    // The blocking path does not wait for a throttled scan's rate.
    let (records, _) = scan(
        &service,
        with(field_type::RECORDS_PER_SECOND, &100u32.to_be_bytes()),
    );
    assert_eq!(records.len(), 300);
}

/// RECS_PER_SEC: each step carries a tenth of a second's records, and the
/// next step is due when the records sent so far are due at the rate.
#[test]
fn a_throttled_scan_paces_its_steps() {
    let (service, clock) = populated();
    let spec = ScanSpec {
        partition_done: true,
        extra_fields: vec![(field_type::RECORDS_PER_SECOND, 50u32.to_be_bytes().to_vec())],
        ..ScanSpec::default()
    };
    let mut out = Vec::new();
    let mut pending = start_scan(&service, &spec, &mut out);
    let mut per_step = vec![decode_stream(&out).0.len()];
    let mut waited_ms = 0;
    while let Some(continuation) = pending {
        let pause = service.pause_of(&continuation).expect("ahead of its rate");
        // Five records a step at 50 a second: each due 100 ms after the last.
        assert_eq!(pause, std::time::Duration::from_millis(100));
        clock.advance_ms(50);
        assert_eq!(
            service.pause_of(&continuation),
            Some(std::time::Duration::from_millis(50))
        );
        clock.advance_ms(50);
        waited_ms += 100;
        assert_eq!(service.pause_of(&continuation), None, "due now");
        out.clear();
        pending = service.resume(continuation, &mut out);
        per_step.push(decode_stream(&out).0.len());
    }
    // 300 records five at a time; the step after the 300th finds the
    // partitions left empty and ends the stream (the LAST message alone).
    assert_eq!(per_step.len(), 61, "{per_step:?}");
    assert!(
        per_step[..60].iter().all(|count| *count == 5),
        "{per_step:?}"
    );
    assert_eq!(per_step[60], 1);
    assert_eq!(waited_ms, 6000);
    // A wall clock stepped back an hour holds a scan for one step's
    // interval at most, and the schedule starts again from the new time.
    let continuation = start_scan(&service, &spec, &mut Vec::new()).expect("more than one step");
    clock.rewind_ms(3_600_000);
    assert_eq!(
        service.pause_of(&continuation),
        Some(std::time::Duration::from_millis(1000))
    );
    clock.advance_ms(1000);
    let mut out = Vec::new();
    let next = service.resume(continuation, &mut out).expect("more steps");
    assert_eq!(decode_stream(&out).0.len(), 5);
    assert_eq!(
        service.pause_of(&next),
        Some(std::time::Duration::from_millis(100)),
        "back on schedule"
    );
    // An unthrottled scan is never held.
    let unthrottled = ScanSpec {
        partition_done: true,
        ..ScanSpec::default()
    };
    if let Some(continuation) = start_scan(&service, &unthrottled, &mut Vec::new()) {
        assert_eq!(service.pause_of(&continuation), None);
    }
}

/// The step that sends a throttled scan's last records ahead of its rate
/// does not end the stream: the LAST message waits until they are due.
#[test]
fn a_throttled_scan_ends_no_sooner_than_its_records_are_due() {
    let (service, clock) = populated();
    // 300 records at 70 a second, seven a step: the 43rd step sends the
    // last six and finds the partitions done.
    let spec = ScanSpec {
        partition_done: true,
        extra_fields: vec![(field_type::RECORDS_PER_SECOND, 70u32.to_be_bytes().to_vec())],
        ..ScanSpec::default()
    };
    let mut out = Vec::new();
    let mut pending = start_scan(&service, &spec, &mut out);
    let mut per_step = vec![decode_stream(&out).0.len()];
    let mut waited_ms = 0u64;
    while let Some(continuation) = pending {
        if let Some(pause) = service.pause_of(&continuation) {
            let ms = u64::try_from(pause.as_millis()).expect("a short pause");
            clock.advance_ms(ms);
            waited_ms += ms;
        }
        out.clear();
        pending = service.resume(continuation, &mut out);
        per_step.push(decode_stream(&out).0.len());
    }
    assert_eq!(per_step.len(), 44, "{per_step:?}");
    assert_eq!(per_step[42], 6, "{per_step:?}");
    assert_eq!(per_step[43], 1, "the LAST message alone: {per_step:?}");
    assert!(waited_ms >= 300 * 1000 / 70, "{waited_ms} ms");
}

#[test]
fn streams_in_bounded_chunks_and_resumes_mid_partition() {
    let (service, _) = service();
    // ~6 MB of records in few partitions' worth per chunk.
    for key in 0..300 {
        put_blob(&service, "demo", &format!("b{key}"), 20_000);
    }
    let spec = ScanSpec {
        partition_done: true,
        ..ScanSpec::default()
    };
    let frame = scan_frame(&spec);
    let mut header_bytes = [0u8; 8];
    header_bytes.copy_from_slice(&frame[..8]);
    let header = ProtoHeader::decode(&header_bytes).unwrap();
    let mut out = Vec::new();
    let mut pending = service
        .handle_streaming(header, &frame[8..], &mut out)
        .unwrap();
    let mut chunks = vec![std::mem::take(&mut out)];
    while let Some(continuation) = pending {
        pending = service.resume(continuation, &mut out);
        chunks.push(std::mem::take(&mut out));
    }
    assert!(chunks.len() >= 5, "{} chunks", chunks.len());
    let mut messages = Vec::new();
    for chunk in &chunks {
        assert!(
            chunk.len() <= CHUNK_BYTES + 30_000,
            "chunk of {}",
            chunk.len()
        );
        let (decoded, frames) = decode_stream(chunk);
        assert!(frames <= 1);
        messages.extend(decoded);
    }
    let last = messages.pop().unwrap();
    assert_eq!(last.header.info3, info3::LAST);
    assert_eq!(messages.len(), 300);
    let unique: BTreeSet<Digest> = messages.iter().map(digest_of).collect();
    assert_eq!(unique.len(), 300);

    // One partition bigger than a chunk: the cursor resumes inside it.
    let (service, _) = crate::batch::tests::service();
    let mut same_partition = Vec::new();
    let mut key = 0;
    let target = digest("demo", "p0").partition();
    while same_partition.len() < 80 {
        let name = format!("p{key}");
        if digest("demo", &name).partition() == target {
            same_partition.push(name);
        }
        key += 1;
    }
    for name in &same_partition {
        put_blob(&service, "demo", name, 30_000);
    }
    let mut spec = spec.clone();
    spec.pids = Some(vec![target.get()]);
    let mut out = Vec::new();
    let mut pending = start_scan(&service, &spec, &mut out);
    let mut steps = 1;
    while let Some(continuation) = pending {
        pending = service.resume(continuation, &mut out);
        steps += 1;
    }
    assert!(steps >= 3, "{steps} steps");
    let (mut messages, _) = decode_stream(&out);
    messages.pop();
    let got: Vec<Digest> = messages.iter().map(digest_of).collect();
    let mut expected: Vec<Digest> = same_partition
        .iter()
        .map(|name| digest("demo", name))
        .collect();
    expected.sort();
    assert_eq!(got, expected);
}

#[test]
fn a_sparse_set_never_sends_empty_frames() {
    let (service, _) = service();
    // Many records outside the set, few inside: steps end on the examine
    // budget with nothing to send.
    for key in 0..(EXAMINE_BUDGET as i64 + 5_000) {
        put(&service, "bulk", &format!("x{key}"), &[("n", key)], false);
    }
    put(&service, "rare", "only", &[("n", 1)], false);
    let spec = ScanSpec {
        partition_done: true,
        set: Some("rare"),
        ..ScanSpec::default()
    };
    let mut out = Vec::new();
    let mut pending = start_scan(&service, &spec, &mut out);
    let mut steps = 1;
    while let Some(continuation) = pending {
        pending = service.resume(continuation, &mut out);
        steps += 1;
    }
    assert!(steps >= 2);
    let (messages, _) = decode_stream(&out);
    assert_eq!(messages.len(), 2);
}

/// Starts the scan `spec` describes: its first step's chunk goes to `out`.
fn start_scan(
    service: &Service,
    spec: &ScanSpec,
    out: &mut Vec<u8>,
) -> Option<crate::Continuation> {
    let frame = scan_frame(spec);
    service
        .handle_streaming(header_of(&frame), &frame[8..], out)
        .unwrap()
}

fn header_of(frame: &[u8]) -> ProtoHeader {
    let mut header_bytes = [0u8; 8];
    header_bytes.copy_from_slice(&frame[..8]);
    ProtoHeader::decode(&header_bytes).unwrap()
}

/// A fabric that reaches nobody (the scan path never calls it).
struct Nowhere;

impl crate::replication::Fabric for Nowhere {
    fn call(
        &self,
        _: citrine_types::NodeId,
        _: u8,
        _: Vec<u8>,
        _: std::time::Duration,
    ) -> crate::replication::FabricFuture {
        Box::pin(async { Err(crate::replication::FabricError::Unreachable) })
    }
}

/// In a cluster, a node scans only the partitions it masters and holds
/// whole; the others are reported unavailable (partition-done, 11) so the
/// client retries them elsewhere — before the view's exchange, all of them.
#[test]
fn in_a_cluster_only_whole_mastered_partitions_are_scanned() {
    let (service, _) = populated();
    let (all, _) = scan(&service, ScanSpec::default());
    let state = |me: u64| two_node_view(service.node_id.0, me);
    service.set_fabric(std::sync::Arc::new(Nowhere));
    service.publish_cluster(state(service.node_id.0));
    let spec = ScanSpec {
        partition_done: true,
        ..ScanSpec::default()
    };
    let split = |messages: Vec<Msg>| {
        let (done, records): (Vec<Msg>, Vec<Msg>) = messages
            .into_iter()
            .filter(|message| message.header.info3 != info3::LAST)
            .partition(|message| message.header.info3 == info3::PARTITION_DONE);
        (done, records)
    };
    // Exchanging: nothing is known to be whole.
    let (done, records) = split(run(&service, &scan_frame(&spec)));
    assert!(records.is_empty());
    assert_eq!(done.len(), 4096);
    assert!(done.iter().all(|message| message.header.result_code == 11));
    // After the exchange (the other node is empty): this node's own
    // partitions are whole here, the other node's are not served here.
    let other = service_with_id(service.node_id.0 + 1);
    other.publish_cluster(state(service.node_id.0 + 1));
    assert!(service.dist().finish_exchange(
        service.migrations().epoch(),
        vec![(other.node_id, other.migrations().exchange_answer(77))]
    ));
    let map = state(service.node_id.0);
    let mastered = |pid: u16| {
        map.namespaces[0]
            .map
            .replicas(PartitionId::new(pid).unwrap())
            .first()
            == Some(&service.node_id)
    };
    let (done, records) = split(run(&service, &scan_frame(&spec)));
    let done_pids: BTreeSet<u16> = done
        .iter()
        .map(|message| message.header.generation as u16)
        .collect();
    assert!(!records.is_empty() && !done.is_empty());
    assert!(done_pids.iter().all(|pid| !mastered(*pid)));
    assert_eq!(
        done_pids.len() + (0..4096).filter(|pid| mastered(*pid)).count(),
        4096
    );
    assert!(records
        .iter()
        .all(|record| mastered(digest_of(record).partition().get())));
    let expected = all
        .iter()
        .filter(|record| mastered(digest_of(record).partition().get()))
        .count();
    assert_eq!(records.len(), expected);
}

/// The view (cluster key 77, two copies of `test`) of nodes `first` and
/// `first + 1`, as node `me` publishes it.
fn two_node_view(first: u64, me: u64) -> crate::cluster_state::ClusterState {
    crate::tests::view(me, 77, &[first, first + 1])
}

fn service_with_id(node_id: u64) -> Service {
    let config = crate::config::ServiceConfig::local(
        node_id,
        vec![crate::config::NamespaceConfig::in_memory("test")],
    );
    Service::new(config, Arc::new(crate::ManualClock::new(START_MS)))
}

/// A node of a two-node view holding the only copy of `records` blobs in
/// one partition the other (empty) node masters: after the exchange it is
/// that partition's acting master, claiming it.
fn an_acting_master(records: usize) -> (Service, PartitionId) {
    use crate::migration::MasterClaim;
    use citrine_types::NodeId;
    let (service, _) = service();
    let (me, peer) = (service.node_id.0, service.node_id.0 + 1);
    let state = |id: u64| two_node_view(me, id);
    let map = state(me);
    let mut target = None;
    let mut stored = 0;
    for key in 0.. {
        let name = format!("a{key}");
        let partition = digest("demo", &name).partition();
        if map.namespaces[0].map.replicas(partition).first() != Some(&NodeId(peer))
            || target.is_some_and(|target| target != partition)
        {
            continue;
        }
        target = Some(partition);
        put_blob(&service, "demo", &name, 30_000);
        stored += 1;
        if stored == records {
            break;
        }
    }
    let target = target.unwrap();
    service.set_fabric(Arc::new(Nowhere));
    service.publish_cluster(state(me));
    let other = service_with_id(peer);
    other.publish_cluster(state(peer));
    assert!(service.dist().finish_exchange(
        service.migrations().epoch(),
        vec![(other.node_id, other.migrations().exchange_answer(77))]
    ));
    assert_eq!(
        service
            .migrations()
            .master_claim("test", target, service.node_id),
        MasterClaim::Acting
    );
    (service, target)
}

/// Runs the request `frame` to its end; `release` hands the acting claim
/// of `target` back after the first step. The stream's messages, LAST
/// included.
fn run_releasing(service: &Service, frame: &[u8], target: PartitionId, release: bool) -> Vec<Msg> {
    let mut out = Vec::new();
    let mut pending = service
        .handle_streaming(header_of(frame), &frame[8..], &mut out)
        .unwrap();
    assert!(pending.is_some(), "more than one step");
    if release {
        service.migrations().hand_over(
            service.migrations().epoch(),
            "test",
            target,
            service.node_id,
            crate::migration::Handover::Releasing,
        );
    }
    while let Some(continuation) = pending {
        pending = service.resume(continuation, &mut out);
    }
    decode_stream(&out).0
}

/// A node holding the only copy of a partition its new master has yet to
/// be filled with claims it as acting master: it serves scans that list
/// the partition (not those for all partitions), and when its claim ends
/// before the walk does, it reports the partition unavailable at the end
/// so the client resumes it at the master.
#[test]
fn an_acting_master_serves_listed_scans_while_it_claims() {
    let (service, target) = an_acting_master(80);
    let listed = scan_frame(&ScanSpec {
        partition_done: true,
        pids: Some(vec![target.get()]),
        ..ScanSpec::default()
    });
    let walk = |release: bool| {
        let mut messages = run_releasing(&service, &listed, target, release);
        assert_eq!(messages.pop().unwrap().header.info3, info3::LAST);
        let (done, records): (Vec<Msg>, Vec<Msg>) = messages
            .into_iter()
            .partition(|message| message.header.info3 == info3::PARTITION_DONE);
        (done, records.len())
    };
    // Claimed throughout: every record, no partition-done.
    let (done, records) = walk(false);
    assert!(done.is_empty());
    assert_eq!(records, 80);
    // A scan for all partitions does not follow the claim.
    let mut messages = run(
        &service,
        &scan_frame(&ScanSpec {
            partition_done: true,
            ..ScanSpec::default()
        }),
    );
    messages.pop();
    assert!(messages
        .iter()
        .any(|message| message.header.info3 == info3::PARTITION_DONE
            && message.header.generation == u32::from(target.get())
            && message.header.result_code == 11));
    assert!(messages
        .iter()
        .all(|message| message.header.info3 == info3::PARTITION_DONE));
    // The claim ends mid-walk: the partition is reported unavailable.
    let (done, _) = walk(true);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].header.generation, u32::from(target.get()));
    assert_eq!(done[0].header.result_code, 11);
}

/// An aggregation that lists the partition is served by its acting master
/// while it claims it, and fails (11) when the claim ends before the
/// partition's walk does: its result could miss writes, and there is no
/// per-partition answer to retry it by. One for all partitions fails.
#[test]
fn an_acting_master_serves_listed_aggregations_while_it_claims() {
    use base64::Engine as _;
    let (service, target) = an_acting_master(80);
    let source = "local function plus(a, b) return a + b end\nfunction count(stream)\n  return stream : map(function(rec) return 1 end) : reduce(plus)\nend\n";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    let answers = crate::tests::info(
        &service,
        &[&format!("udf-put:filename=agg.lua;content={content};")],
    );
    assert_eq!(answers[0].1, "ok");
    let aggregation = |pids: Option<Vec<u16>>| {
        scan_frame(&ScanSpec {
            pids,
            extra_fields: vec![
                (field_type::UDF_OP, vec![udf_op::AGGREGATE]),
                (field_type::UDF_FILENAME, b"agg".to_vec()),
                (field_type::UDF_FUNCTION, b"count".to_vec()),
                (field_type::UDF_ARGLIST, vec![0x90]),
            ],
            ..ScanSpec::default()
        })
    };
    let listed = aggregation(Some(vec![target.get()]));
    let counted = |messages: &[Msg]| -> Vec<i64> {
        messages
            .iter()
            .filter(|message| message.header.info3 == 0)
            .filter_map(|message| message.bin("SUCCESS"))
            .map(|value| i64::from_be_bytes(value.try_into().unwrap()))
            .collect()
    };
    let mut messages = run_releasing(&service, &listed, target, false);
    let last = messages.pop().unwrap();
    assert_eq!(
        (last.header.info3, last.header.result_code),
        (info3::LAST, 0)
    );
    assert_eq!(counted(&messages), vec![80]);
    let mut messages = run_releasing(&service, &listed, target, true);
    let last = messages.pop().unwrap();
    assert_eq!(
        (last.header.info3, last.header.result_code),
        (info3::LAST, 11)
    );
    assert!(
        counted(&messages).is_empty(),
        "no result for a partition it lost"
    );
    let messages = run(&service, &aggregation(None));
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].header.result_code, 0, "nothing it masters");
}

/// The view of nodes `first..first + count` (two copies of `test`) under
/// cluster `key`, as node `me` publishes it.
fn view_of(first: u64, count: u64, key: u64, me: u64) -> crate::cluster_state::ClusterState {
    let members: Vec<u64> = (first..first + count).collect();
    crate::tests::view(me, key, &members)
}

/// Publishes view `key` of `count` nodes on `service` (the first) and
/// resolves its exchange against empty peers.
fn publish_alone_with_data(service: &Service, count: u64, key: u64) {
    let me = service.node_id.0;
    service.publish_cluster(view_of(me, count, key, me));
    let answers = (me + 1..me + count)
        .map(|id| {
            let peer = service_with_id(id);
            peer.publish_cluster(view_of(me, count, key, id));
            (peer.node_id, peer.migrations().exchange_answer(key))
        })
        .collect();
    assert!(service
        .dist()
        .finish_exchange(service.migrations().epoch(), answers));
}

/// A background job keeps the partitions its node masters and pins them:
/// a copy the migrations drop meanwhile (a view moved the partition away)
/// stays until the job has walked it, then goes. A drop a later view made
/// obsolete is not done; a job that ends early releases its pins for
/// `drop_released_copies`.
#[test]
fn a_background_jobs_partitions_are_dropped_only_once_walked() {
    use citrine_types::NodeId;
    let (service, _) = populated();
    let me = service.node_id.0;
    service.set_fabric(Arc::new(Nowhere));
    publish_alone_with_data(&service, 3, 80);
    let frame = scan_frame(&ScanSpec {
        set: Some("demo"),
        ..ScanSpec::default()
    });
    let message = Message::decode(&frame[8..]).unwrap();
    let namespace = service.namespace_shared(b"test").unwrap();
    let cursor = || {
        let indexes = service.sindexes(&namespace);
        let mut cursor = parse(&message, Arc::clone(&namespace), indexes, true)
            .unwrap()
            .unwrap();
        cursor.keep_mastered_partitions(service.layers());
        cursor
    };
    let mut job = cursor();
    let early = cursor();
    // Four nodes: some partitions this node mastered are no longer its.
    publish_alone_with_data(&service, 4, 81);
    let later = view_of(me, 4, 81, me);
    let held = |partition: PartitionId| namespace.index.partition(partition).read().len();
    let moved: Vec<PartitionId> = job
        .partitions
        .iter()
        .map(|cursor| cursor.partition)
        .filter(|partition| {
            held(*partition) > 0
                && !later.namespaces[0]
                    .map
                    .replicas(*partition)
                    .contains(&NodeId(me))
        })
        .collect();
    assert!(moved.len() >= 2, "{moved:?}");
    let (walked, stale) = (moved[0], moved[1]);
    let records = held(walked);
    // Sent: the migrations drop the copy, but the jobs still walk it.
    service.dist().drop_copy("test", walked);
    assert_eq!(held(walked), records, "kept for the jobs");
    assert_eq!(service.migrations().pins.deferred(), 1);
    let mut out = Vec::new();
    while !job.advance(service.layers(), service.now(), &mut out) {
        assert!(!job.blocked());
    }
    let digests = job.take_collected();
    let of_walked = digests
        .iter()
        .filter(|digest| digest.partition() == walked)
        .count();
    assert_eq!(of_walked, records, "the job found every record");
    assert_eq!(held(walked), records, "the other job has not walked it");
    // The other job ends early: its pins go, and the copy with them.
    drop(early);
    assert_eq!(held(walked), records);
    service.dist().drop_released_copies();
    assert_eq!(held(walked), 0, "dropped once no job needs it");
    assert_eq!(service.migrations().pins.deferred(), 0);
    // A drop asked under view 81, obsolete once view 82 is made: the new
    // plan decides again (here: the copy is still to be sent).
    let pins = &service.migrations().pins;
    pins.pin("test", [stale.index() as u16].into_iter());
    service.dist().drop_copy("test", stale);
    assert_eq!(pins.deferred(), 1);
    publish_alone_with_data(&service, 4, 82);
    let asked = pins.unpin("test", stale.index() as u16);
    assert!(asked.is_some());
    if let Some(epoch) = asked {
        service.dist().drop_deferred("test", stale, epoch);
    }
    assert!(held(stale) > 0, "kept: a later view decides its fate");
}

/// `query-show`'s line for task id `trid`, as `key=value` pairs in order.
fn show_pairs(service: &Service, trid: u64) -> Vec<(String, String)> {
    let line = crate::tests::info(service, &[&format!("query-show:id={trid}")])
        .remove(0)
        .1;
    line.split(':')
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key.to_owned(), value.to_owned())
        })
        .collect()
}

fn show_field(service: &Service, trid: u64, key: &str) -> String {
    show_pairs(service, trid)
        .into_iter()
        .find(|(name, _)| name == key)
        .map(|(_, value)| value)
        .unwrap_or_else(|| panic!("no {key} for job {trid}"))
}

/// A scan request with task id `trid` (and the spec's other fields).
fn scan_with_trid(spec: &ScanSpec, trid: u64) -> Vec<u8> {
    scan_frame(&ScanSpec {
        partition_done: true,
        trid: Some(trid),
        ..spec.clone()
    })
}

/// Starts `frame` as the client at 127.0.0.1:5555 sends it: its first
/// chunk in `out`, and the rest of its stream if it goes on.
fn start_from_client(
    service: &Service,
    frame: &[u8],
    out: &mut Vec<u8>,
) -> Option<crate::Continuation> {
    let from = std::net::SocketAddr::from(([127, 0, 0, 1], 5555));
    service
        .handle_streaming_from(
            header_of(frame),
            &frame[8..],
            out,
            crate::Arrival {
                from: Some(from),
                ..crate::Arrival::default()
            },
        )
        .unwrap()
}

/// A client's scan or query is a `basic` job `query-show` lists, in the
/// reference's fields and order, while it runs and after it ends.
#[test]
fn a_clients_scan_is_a_job_query_show_lists() {
    let (service, _) = populated();
    let spec = ScanSpec {
        set: Some("demo"),
        pids: Some((0..4096).collect()),
        ..ScanSpec::default()
    };
    let mut out = Vec::new();
    let mut pending = start_from_client(&service, &scan_with_trid(&spec, 4242), &mut out);
    while let Some(continuation) = pending {
        pending = service.resume(continuation, &mut out);
    }
    let keys: Vec<String> = show_pairs(&service, 4242)
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    let expected = "trid ns set n-pids-requested n-keyds-requested rps active-threads status \
        job-progress run-time time-since-done recs-throttled recs-filtered-meta recs-filtered-bins \
        recs-succeeded recs-failed from job-type net-io-bytes net-io-time socket-timeout";
    assert_eq!(keys.join(" "), expected);
    let field = |key| show_field(&service, 4242, key);
    assert_eq!(field("trid"), "4242");
    assert_eq!(field("set"), "demo");
    assert_eq!(field("n-pids-requested"), "4096");
    assert_eq!(field("status"), "done(ok)");
    assert_eq!(field("job-progress"), "100.00");
    assert_eq!(field("active-threads"), "0");
    assert_eq!(field("recs-succeeded"), "200");
    assert_eq!(field("from"), "127.0.0.1+5555");
    assert_eq!(field("job-type"), "basic");
    assert_eq!(field("net-io-bytes"), out.len().to_string());
    assert_eq!(field("socket-timeout"), "1000");
    // A query names its index; a scan of a set never written is a job too.
    assert_eq!(
        crate::tests::info(
            &service,
            &["sindex-create:ns=test;set=demo;indexname=by_n;bin=n;type=NUMERIC"]
        )[0]
        .1,
        "ok"
    );
    let query = ScanSpec {
        set: Some("demo"),
        extra_fields: vec![(
            field_type::INDEX_RANGE,
            crate::sindex::tests::int_range("n", 0, 9),
        )],
        ..ScanSpec::default()
    };
    let mut out = Vec::new();
    assert!(start_from_client(&service, &scan_with_trid(&query, 4243), &mut out).is_none());
    assert_eq!(show_field(&service, 4243, "sindex-name"), "by_n");
    assert_eq!(show_field(&service, 4243, "recs-succeeded"), "10");
    let never = ScanSpec {
        set: Some("never"),
        ..ScanSpec::default()
    };
    let mut out = Vec::new();
    assert!(start_from_client(&service, &scan_with_trid(&never, 4244), &mut out).is_none());
    assert_eq!(show_field(&service, 4244, "status"), "done(ok)");
    assert_eq!(
        show_field(&service, 4244, "net-io-bytes"),
        out.len().to_string()
    );
    // Newest first.
    let all = crate::tests::info(&service, &["query-show"]).remove(0).1;
    let order: Vec<&str> = all
        .split(';')
        .filter_map(|line| line.split(':').next())
        .collect();
    assert_eq!(&order[..3], ["trid=4244", "trid=4243", "trid=4242"]);
}

/// A client's short query (`info1 SHORT_QUERY`) is not a job `query-show`
/// lists, as the reference tracks none (the Rust client's suite,
/// `test_short_query_not_tracked`); a long one with the same request is.
#[test]
fn a_clients_short_scan_is_not_listed_by_query_show() {
    let (service, _) = populated();
    let spec = ScanSpec {
        set: Some("demo"),
        ..ScanSpec::default()
    };
    let mut short = scan_with_trid(&spec, 4252);
    // info1: the byte after the AS_MSG header's size.
    short[PROTO_HEADER_SIZE + 1] |= info1::SHORT_QUERY;
    for (frame, trid) in [(short, 4252), (scan_with_trid(&spec, 4253), 4253)] {
        let mut out = Vec::new();
        let mut pending = start_from_client(&service, &frame, &mut out);
        while let Some(continuation) = pending {
            pending = service.resume(continuation, &mut out);
        }
        assert!(!out.is_empty(), "job {trid} answered");
    }
    let show = |trid: u64| {
        crate::tests::info(&service, &[&format!("query-show:id={trid}")])
            .remove(0)
            .1
    };
    assert_eq!(show(4252), "ERROR:2:job not found");
    assert_eq!(show_field(&service, 4253, "status"), "done(ok)");
    let all = crate::tests::info(&service, &["query-show"]).remove(0).1;
    assert!(!all.contains("trid=4252:"), "{all}");
}

/// A throttled scan (RECS_PER_SEC 10: one record a step) `query-show`
/// lists as active while its client reads it; dropped mid-stream (the
/// client went away) it is abandoned; its task id is not taken by a
/// second scan meanwhile (4, as the reference refuses it).
#[test]
fn a_scan_whose_client_goes_away_is_abandoned() {
    let (service, _) = populated();
    let spec = ScanSpec {
        set: Some("demo"),
        extra_fields: vec![(field_type::RECORDS_PER_SECOND, 10u32.to_be_bytes().to_vec())],
        ..ScanSpec::default()
    };
    let mut out = Vec::new();
    let continuation = start_from_client(&service, &scan_with_trid(&spec, 77), &mut out).unwrap();
    assert_eq!(show_field(&service, 77, "status"), "active(ok)");
    assert_eq!(show_field(&service, 77, "active-threads"), "1");
    assert_eq!(show_field(&service, 77, "rps"), "10");
    assert_eq!(show_field(&service, 77, "recs-succeeded"), "1");
    assert_eq!(show_field(&service, 77, "recs-throttled"), "1");
    let mut second = Vec::new();
    assert!(start_from_client(&service, &scan_with_trid(&spec, 77), &mut second).is_none());
    let refusal = decode_stream(&second).0;
    assert_eq!(refusal[0].header.result_code, 4);
    drop(continuation);
    assert_eq!(
        show_field(&service, 77, "status"),
        "done(abandoned-response-error)"
    );
    assert_eq!(show_field(&service, 77, "job-progress"), "100.00");
    // Its task id is free again.
    let mut third = Vec::new();
    assert!(start_from_client(&service, &scan_with_trid(&spec, 77), &mut third).is_some());
}

/// `query-abort` stops a client's scan: its stream ends with 15 (query
/// aborted), and the job is done(user-aborted); the info answers are the
/// reference's.
#[test]
fn query_abort_stops_a_clients_scan() {
    let (service, _) = populated();
    let spec = ScanSpec {
        set: Some("demo"),
        extra_fields: vec![(field_type::RECORDS_PER_SECOND, 10u32.to_be_bytes().to_vec())],
        ..ScanSpec::default()
    };
    let info = |command: &str| crate::tests::info(&service, &[command]).remove(0).1;
    let mut out = Vec::new();
    let continuation = start_from_client(&service, &scan_with_trid(&spec, 91), &mut out).unwrap();
    assert_eq!(info("query-abort:id=91"), "ok");
    assert_eq!(show_field(&service, 91, "status"), "active(user-aborted)");
    let mut rest = Vec::new();
    assert!(service.resume(continuation, &mut rest).is_none());
    let (messages, _) = decode_stream(&rest);
    let last = messages.last().unwrap();
    assert_eq!(
        (last.header.info3, last.header.result_code),
        (info3::LAST, 15)
    );
    assert_eq!(show_field(&service, 91, "status"), "done(user-aborted)");
    assert_eq!(info("query-abort:id=91"), "ERROR:2:id not active");
    assert_eq!(info("query-abort:id=92"), "ERROR:2:id not active");
    assert_eq!(info("query-abort:id=0"), "ERROR:4:bad id");
    assert_eq!(info("query-show:id=x"), "ERROR:4:bad id");
    assert_eq!(info("query-show:id=92"), "ERROR:2:job not found");
    // query-abort-all stops every active job.
    let mut out = Vec::new();
    let first = start_from_client(&service, &scan_with_trid(&spec, 93), &mut out).unwrap();
    let second = start_from_client(&service, &scan_with_trid(&spec, 94), &mut out).unwrap();
    assert_eq!(info("query-abort-all"), "number-of-queries-killed:2");
    drop((first, second));
    assert_eq!(info("query-abort-all"), "number-of-queries-killed:0");
}

/// A client's aggregation is an `aggregation` job (its stream's records
/// are its successes); one over a set never written is none.
#[test]
fn a_clients_aggregation_is_a_job_query_show_lists() {
    let (service, _) = populated();
    put_sum_module(&service);
    let aggregation = |set: &'static str| ScanSpec {
        set: Some(set),
        extra_fields: vec![
            (field_type::UDF_OP, vec![udf_op::AGGREGATE]),
            (field_type::UDF_FILENAME, b"sum".to_vec()),
            (field_type::UDF_FUNCTION, b"count".to_vec()),
            (field_type::UDF_ARGLIST, vec![0x90]),
        ],
        ..ScanSpec::default()
    };
    let mut out = Vec::new();
    let mut pending = start_from_client(
        &service,
        &scan_with_trid(&aggregation("demo"), 61),
        &mut out,
    );
    while let Some(continuation) = pending {
        pending = service.resume(continuation, &mut out);
    }
    let keys: Vec<String> = show_pairs(&service, 61)
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    let expected = "trid ns set rps active-threads status job-progress run-time time-since-done \
        recs-throttled recs-filtered-meta recs-filtered-bins recs-succeeded recs-failed from \
        job-type net-io-bytes net-io-time socket-timeout";
    assert_eq!(keys.join(" "), expected);
    assert_eq!(show_field(&service, 61, "job-type"), "aggregation");
    assert_eq!(show_field(&service, 61, "status"), "done(ok)");
    assert_eq!(show_field(&service, 61, "recs-succeeded"), "200");
    assert_eq!(
        show_field(&service, 61, "net-io-bytes"),
        out.len().to_string()
    );
    let mut out = Vec::new();
    assert!(start_from_client(
        &service,
        &scan_with_trid(&aggregation("never"), 62),
        &mut out
    )
    .is_none());
    assert_eq!(
        crate::tests::info(&service, &["query-show:id=62"])
            .remove(0)
            .1,
        "ERROR:2:job not found"
    );
}

/// An aggregation with RECS_PER_SEC is paced as a scan is: the connection
/// holds it between steps until its records are due.
#[test]
fn a_throttled_aggregation_is_paced() {
    let (service, clock) = populated();
    put_sum_module(&service);
    let spec = ScanSpec {
        set: Some("demo"),
        partition_done: true,
        extra_fields: vec![
            (field_type::UDF_OP, vec![udf_op::AGGREGATE]),
            (field_type::UDF_FILENAME, b"sum".to_vec()),
            (field_type::UDF_FUNCTION, b"count".to_vec()),
            (field_type::UDF_ARGLIST, vec![0x90]),
            (field_type::RECORDS_PER_SECOND, 50u32.to_be_bytes().to_vec()),
        ],
        ..ScanSpec::default()
    };
    let mut out = Vec::new();
    let mut pending = start_scan(&service, &spec, &mut out);
    let mut steps = 0;
    while let Some(continuation) = pending {
        // Five records a step at 50 a second: each due 100 ms after the last.
        assert_eq!(
            service.pause_of(&continuation),
            Some(std::time::Duration::from_millis(100))
        );
        clock.advance_ms(100);
        assert_eq!(service.pause_of(&continuation), None, "due now");
        pending = service.resume(continuation, &mut out);
        steps += 1;
    }
    // 200 records five at a time, then the step that ends the stream.
    assert_eq!(steps, 40);
    let (messages, _) = decode_stream(&out);
    let counted: i64 = messages
        .iter()
        .filter_map(|message| message.bin("SUCCESS"))
        .map(|value| i64::from_be_bytes(value.try_into().unwrap()))
        .sum();
    assert_eq!(counted, 200);
}

/// A partition a change was cut short in (a panic under its write guard
/// after the change began) is reported unavailable (11) and its records
/// are not sent; every other partition is scanned as before.
#[test]
fn a_partition_a_change_was_cut_short_in_is_reported_unavailable() {
    let (service, _) = populated();
    let (all, _) = scan(&service, ScanSpec::default());
    let victim = digest_of(&all[0]).partition();
    let namespace = service.namespace(b"test").unwrap();
    let cut_short = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut index = namespace.index.partition(victim).write();
        let _changing: &mut citrine_index::PartitionIndex = &mut index;
        panic!("a change cut short");
    }));
    assert!(cut_short.is_err());
    let spec = ScanSpec {
        partition_done: true,
        ..ScanSpec::default()
    };
    let messages = run(&service, &scan_frame(&spec));
    let unavailable: Vec<u16> = messages
        .iter()
        .filter(|message| {
            message.header.info3 == info3::PARTITION_DONE && message.header.result_code == 11
        })
        .map(|message| message.header.generation as u16)
        .collect();
    assert_eq!(unavailable, vec![victim.get()]);
    let records: Vec<&Msg> = messages
        .iter()
        .filter(|message| message.header.info3 == 0)
        .collect();
    assert!(records
        .iter()
        .all(|record| digest_of(record).partition() != victim));
    let in_victim = all
        .iter()
        .filter(|record| digest_of(record).partition() == victim)
        .count();
    assert_eq!(records.len(), all.len() - in_victim);
}

/// A client's short scan (`info1 SHORT_QUERY`) counts in `{NS}-pi-query`
/// once its stream ended; a long one does not, as in the reference.
#[test]
fn a_finished_short_scan_counts_in_the_pi_query_histogram() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("x", 1)], false);
    let (records, _) = scan(&service, ScanSpec::default());
    assert_eq!(records.len(), 1);
    let mut short = scan_frame(&ScanSpec {
        partition_done: true,
        ..ScanSpec::default()
    });
    // info1: the byte after the AS_MSG header's size.
    short[PROTO_HEADER_SIZE + 1] |= info1::SHORT_QUERY;
    let messages = run(&service, &short);
    assert_eq!(messages.len(), 2, "the record and LAST");
    let totals = crate::latency::totals(service.latencies());
    let expected = [("{test}-write", 1), ("{test}-pi-query", 1)];
    assert_eq!(
        totals,
        expected.map(|(name, count)| (name.to_owned(), count))
    );
}
