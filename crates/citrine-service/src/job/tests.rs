//! Background scans and queries through `Service::handle`: the one-message
//! acceptance, the writes each selected record gets (scan, index query,
//! filter expression, delete), refusals, and `query-show` / `query-abort`.

#![allow(clippy::unwrap_used)]

use crate::batch::tests::{put, run, service, single};
use crate::sindex::tests::{info, int_range};
use crate::Service;
use citrine_wire::msg::{field_type, info1, info2, op_type, MessageWriter, MsgHeader};

/// What a background request carries.
#[derive(Default)]
struct Background<'a> {
    set: Option<&'a str>,
    trid: u64,
    range: Option<Vec<u8>>,
    filter: Option<Vec<u8>>,
    rate: Option<u32>,
    /// (op type, particle type, bin, value)
    ops: Vec<(u8, u8, &'a str, Vec<u8>)>,
    /// A UDF job's module and function.
    udf: Option<(&'a str, &'a str)>,
}

/// Sends a background request; answers the single reply's result code.
fn submit(service: &Service, request: &Background<'_>) -> u8 {
    let mut out = Vec::new();
    let header = MsgHeader {
        info2: info2::WRITE,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer.field(field_type::NAMESPACE, b"test");
    if let Some(set) = request.set {
        writer.field(field_type::SET, set.as_bytes());
    }
    writer.field(field_type::TASK_ID, &request.trid.to_be_bytes());
    if let Some(range) = &request.range {
        writer.field(field_type::INDEX_RANGE, range);
    }
    if let Some(filter) = &request.filter {
        writer.field(field_type::FILTER_EXPRESSION, filter);
    }
    if let Some(rate) = request.rate {
        writer.field(field_type::RECORDS_PER_SECOND, &rate.to_be_bytes());
    }
    if let Some((module, function)) = request.udf {
        writer
            .field(field_type::UDF_OP, &[crate::scan::udf_op::BACKGROUND])
            .field(field_type::UDF_FILENAME, module.as_bytes())
            .field(field_type::UDF_FUNCTION, function.as_bytes())
            .field(field_type::UDF_ARGLIST, &[0x90]);
    }
    for (op, particle, bin, value) in &request.ops {
        writer.op(*op, *particle, bin.as_bytes(), value);
    }
    writer.finish();
    let reply = run(service, &out);
    assert_eq!(reply.len(), 1, "a background request answers one message");
    reply[0].header.result_code
}

/// The integer value of `bin` of record `key` in `set`, if any.
fn read(service: &Service, set: &str, key: &str, bin: &str) -> Option<i64> {
    let header = MsgHeader {
        info1: info1::READ | info1::GET_ALL,
        ..MsgHeader::default()
    };
    single(service, header, set, key, &[])
        .bin(bin)
        .map(|value| i64::from_be_bytes(value.try_into().unwrap()))
}

fn show_value(service: &Service, trid: u64, key: &str) -> String {
    let line = info(service, &format!("query-show:trid={trid}"));
    line.split(':')
        .find_map(|pair| pair.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .to_owned()
}

fn put_op(bin: &str, value: i64) -> (u8, u8, &str, Vec<u8>) {
    (op_type::WRITE, 1, bin, value.to_be_bytes().to_vec())
}

#[test]
fn a_background_scan_writes_every_record_of_its_set() {
    let (service, _) = service();
    for key in 0..60 {
        put(&service, "demo", &format!("k{key}"), &[("n", key)], false);
    }
    put(&service, "other", "o", &[("n", 1)], false);
    let request = Background {
        set: Some("demo"),
        trid: 77,
        ops: vec![
            put_op("flag", 42),
            (op_type::INCR, 1, "n", 1000i64.to_be_bytes().to_vec()),
        ],
        ..Background::default()
    };
    assert_eq!(submit(&service, &request), 0);
    for key in 0..60 {
        assert_eq!(read(&service, "demo", &format!("k{key}"), "flag"), Some(42));
        assert_eq!(
            read(&service, "demo", &format!("k{key}"), "n"),
            Some(key + 1000)
        );
    }
    assert_eq!(read(&service, "other", "o", "flag"), None);
    assert_eq!(show_value(&service, 77, "status"), "done(ok)");
    assert_eq!(show_value(&service, 77, "recs-succeeded"), "60");
    assert_eq!(show_value(&service, 77, "recs-failed"), "0");
    assert_eq!(show_value(&service, 77, "job-progress"), "100.00");
    assert_eq!(show_value(&service, 77, "job-type"), "background-ops");
    assert_eq!(show_value(&service, 77, "set"), "demo");
    // The 8.1 form of the command, and the older scan module's.
    assert_eq!(
        info(&service, "query-show:id=77"),
        info(&service, "query-show:trid=77")
    );
    // The scan module's commands are gone from 8.1, as in the reference.
    assert_eq!(
        info(&service, "scan-show:trid=77"),
        "ERROR:4:unrecognized command"
    );
    assert_eq!(
        info(&service, "query-show:trid=78"),
        "ERROR:2:job not found"
    );
    assert_eq!(
        info(&service, "query-abort:trid=77"),
        "ERROR:2:id not active"
    );
}

/// `query-show` and `query-abort` read their task id as the reference
/// does (each answer below is the reference's for the same command).
#[test]
fn task_ids_are_read_as_the_reference_reads_them() {
    let (service, _) = service();
    put(&service, "demo", "k", &[("n", 1)], false);
    let request = Background {
        set: Some("demo"),
        trid: 77,
        ops: vec![put_op("flag", 42)],
        ..Background::default()
    };
    assert_eq!(submit(&service, &request), 0);
    let line = info(&service, "query-show:id=77");
    assert!(line.contains("status=done(ok)"), "{line}");
    // C's base-0 notation, a sign, a negative number wrapping; `id` before
    // `trid`; a bare key is no parameter (every job is listed).
    for command in [
        "query-show:id=0x4d",
        "query-show:id=0X4D",
        "query-show:id=0115",
        "query-show:id=+77",
        "query-show:id=-18446744073709551539",
        "query-show:trid=x;id=77",
        "query-show:trid=77;id",
        "query-show:trid",
        "query-show:",
        "query-show",
    ] {
        assert_eq!(info(&service, command), line, "{command}");
    }
    for (command, answer) in [
        ("query-abort", "ERROR:4:missing 'id'"),
        ("query-abort:", "ERROR:4:missing 'id'"),
        ("query-abort:id", "ERROR:4:missing 'id'"),
        ("query-abort:x=1", "ERROR:4:missing 'id'"),
        ("query-abort:id=", "ERROR:4:missing 'id' value"),
        ("query-abort:trid=", "ERROR:4:missing 'id' value"),
        ("query-abort:trid=5;id=", "ERROR:4:missing 'id' value"),
        ("query-show:id=", "ERROR:4:missing 'id' value"),
        ("query-show:trid=", "ERROR:4:missing 'id' value"),
        ("query-show:id=;trid=77", "ERROR:4:missing 'id' value"),
        ("query-show:id=x;trid=77", "ERROR:4:bad id"),
        ("query-abort:id=77", "ERROR:2:id not active"),
        ("query-abort:id=-1", "ERROR:2:id not active"),
        ("query-abort:id=0xffffffffffffffff", "ERROR:2:id not active"),
        ("query-show:id=78", "ERROR:2:job not found"),
    ] {
        assert_eq!(info(&service, command), answer, "{command}");
    }
    for id in [
        "abc",
        " 5",
        "5 ",
        "5x",
        "0",
        "-0",
        "00",
        "08",
        "0x",
        "0x-5",
        "-",
        "+-5",
        "18446744073709551616",
        "0x10000000000000000",
        "-18446744073709551616",
    ] {
        for command in ["query-abort", "query-show"] {
            let text = format!("{command}:id={id}");
            assert_eq!(info(&service, &text), "ERROR:4:bad id", "{text}");
        }
    }
}

/// A background job sent again with the task id of one registered before
/// (here finished) is refused with 4, as the reference refuses it (the C
/// client's suite, `scan_basics_background_sameid`), and starts no second
/// job: the increment runs once.
#[test]
fn a_job_sent_again_with_its_task_id_is_refused_and_runs_once() {
    let (service, _) = service();
    for key in 0..5 {
        put(&service, "demo", &format!("k{key}"), &[("n", key)], false);
    }
    let request = Background {
        set: Some("demo"),
        trid: 91,
        ops: vec![(op_type::INCR, 1, "n", 10i64.to_be_bytes().to_vec())],
        ..Background::default()
    };
    assert_eq!(submit(&service, &request), 0);
    assert_eq!(submit(&service, &request), 4);
    for key in 0..5 {
        assert_eq!(
            read(&service, "demo", &format!("k{key}"), "n"),
            Some(key + 10)
        );
    }
    assert_eq!(show_value(&service, 91, "recs-succeeded"), "5");
}

#[test]
fn a_background_query_writes_only_the_records_in_range_and_passing_its_filter() {
    let (service, _) = service();
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=test;indexname=n;bin=n;type=NUMERIC"
        ),
        "ok"
    );
    for key in 0..100 {
        put(
            &service,
            "demo",
            &format!("k{key}"),
            &[("n", key), ("odd", key % 2)],
            false,
        );
    }
    // Filter: bin "odd" == 1: [EQ, [BIN_INT, "odd"], 1] = [1, [2, 2, "odd"], 1]
    // (msgpack: 0x93 0x01 0x93 0x51 0x02 0xa3 "odd" 0x01).
    let filter = vec![0x93, 0x01, 0x93, 0x51, 0x02, 0xa3, b'o', b'd', b'd', 0x01];
    let request = Background {
        set: Some("demo"),
        trid: 5,
        range: Some(int_range("n", 10, 29)),
        filter: Some(filter),
        ops: vec![put_op("hit", 1)],
        ..Background::default()
    };
    assert_eq!(submit(&service, &request), 0);
    for key in 0..100 {
        let expected = ((10..30).contains(&key) && key % 2 == 1).then_some(1);
        assert_eq!(
            read(&service, "demo", &format!("k{key}"), "hit"),
            expected,
            "k{key}"
        );
    }
    assert_eq!(show_value(&service, 5, "recs-succeeded"), "10");
    assert_eq!(show_value(&service, 5, "sindex-name"), "n");
    // A background delete removes the records and their index entries.
    let delete = Background {
        set: Some("demo"),
        trid: 6,
        range: Some(int_range("n", 0, 49)),
        ops: vec![(op_type::DELETE_ALL, 0, "", Vec::new())],
        ..Background::default()
    };
    assert_eq!(submit(&service, &delete), 0);
    assert_eq!(show_value(&service, 6, "recs-succeeded"), "50");
    assert_eq!(read(&service, "demo", "k0", "n"), None);
    assert_eq!(read(&service, "demo", "k50", "n"), Some(50));
    assert!(info(&service, "sindex/test/n").contains("entries=50;"));
}

#[test]
fn refusals_and_empty_jobs() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("n", 1)], false);
    // A read op in a background job: 4, and no job.
    let reads = Background {
        set: Some("demo"),
        trid: 1,
        ops: vec![(op_type::READ, 0, "n", Vec::new())],
        ..Background::default()
    };
    assert_eq!(submit(&service, &reads), 4);
    assert_eq!(info(&service, "query-show:trid=1"), "ERROR:2:job not found");
    // No ops at all: 4.
    let empty = Background {
        set: Some("demo"),
        trid: 2,
        ..Background::default()
    };
    assert_eq!(submit(&service, &empty), 4);
    // A set that does not exist: accepted, with nothing to do and no job
    // to show (the reference's answers), whether or not its filter has an
    // index.
    let missing = Background {
        set: Some("nope"),
        trid: 3,
        ops: vec![put_op("x", 1)],
        ..Background::default()
    };
    assert_eq!(submit(&service, &missing), 0);
    assert_eq!(info(&service, "query-show:trid=3"), "ERROR:2:job not found");
    let missing_query = Background {
        set: Some("nope"),
        trid: 5,
        range: Some(int_range("n", 0, 1)),
        udf: Some(("m", "f")),
        ..Background::default()
    };
    assert_eq!(submit(&service, &missing_query), 0);
    assert_eq!(info(&service, "query-show:trid=5"), "ERROR:2:job not found");
    // A query on an index that does not exist: 201.
    let no_index = Background {
        set: Some("demo"),
        trid: 4,
        range: Some(int_range("n", 0, 1)),
        ops: vec![put_op("x", 1)],
        ..Background::default()
    };
    assert_eq!(submit(&service, &no_index), 201);
}

#[test]
fn only_the_last_hundred_finished_jobs_are_remembered() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("n", 1)], false);
    for trid in 1..=(super::MAX_DONE as u64 + 5) {
        let request = Background {
            set: Some("demo"),
            trid,
            ops: vec![put_op("x", trid as i64)],
            ..Background::default()
        };
        assert_eq!(submit(&service, &request), 0);
    }
    // The newest job's submission saw 104 finished before it: the oldest
    // ones beyond the limit are gone.
    assert_eq!(info(&service, "query-show:trid=1"), "ERROR:2:job not found");
    assert!(info(&service, "query-show:trid=105").contains("status=done(ok)"));
    assert!(info(&service, "query-show:trid=10").contains("status=done(ok)"));
    assert_eq!(read(&service, "demo", "a", "x"), Some(105));
}

#[test]
fn a_background_query_moving_records_in_its_own_range_writes_each_once() {
    let (service, _) = service();
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=test;indexname=n;bin=n;type=NUMERIC"
        ),
        "ok"
    );
    // More entries than one step examines (`scan::EXAMINE_BUDGET`), all at
    // 0, about 17 a partition: each increment moves a record to a bval the
    // query's range still covers, so a job that resumed part-way through a
    // partition by index position would meet some records twice.
    let count = crate::scan::EXAMINE_BUDGET + 4_000;
    for key in 0..count {
        put(&service, "demo", &format!("k{key}"), &[("n", 0)], false);
    }
    let request = Background {
        set: Some("demo"),
        trid: 31,
        range: Some(int_range("n", 0, 1_000_000)),
        rate: Some(1_000_000),
        ops: vec![(op_type::INCR, 1, "n", 1i64.to_be_bytes().to_vec())],
        ..Background::default()
    };
    assert_eq!(submit(&service, &request), 0);
    assert_eq!(
        show_value(&service, 31, "recs-succeeded"),
        count.to_string()
    );
    for key in (0..count).step_by(97) {
        assert_eq!(
            read(&service, "demo", &format!("k{key}"), "n"),
            Some(1),
            "k{key}"
        );
    }
    let stat = info(&service, "sindex/test/n");
    assert!(stat.contains(&format!("entries={count};")), "{stat}");
}

/// Runs `body` while a runner thread serves the service's jobs (as the
/// server's `citrine-jobs` thread does), then stops it.
fn with_runner(service: &Service, body: impl FnOnce()) {
    /// Stops the runner however `body` ends: a failed assertion must fail
    /// the test, not leave the scope waiting for the runner forever.
    struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let stopping = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| service.run_background_jobs(&stopping));
        let _stop = Stop(&stopping);
        while !service.jobs.queue.is_attached() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        body();
    });
}

/// Polls `query-show` until job `trid` is no longer active; panics after
/// `limit`.
fn wait_done(service: &Service, trid: u64, limit: std::time::Duration) -> String {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let status = show_value(service, trid, "status");
        if !status.starts_with("active") {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "job {trid} still {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_paced_job_does_not_hold_up_the_ones_after_it() {
    let (service, _) = service();
    for key in 0..40 {
        put(&service, "slow", &format!("s{key}"), &[("n", key)], false);
        put(&service, "fast", &format!("f{key}"), &[("n", key)], false);
    }
    with_runner(&service, || {
        // 40 records at 10 a second: about 4 s.
        let slow = Background {
            set: Some("slow"),
            trid: 1,
            rate: Some(10),
            ops: vec![put_op("x", 1)],
            ..Background::default()
        };
        assert_eq!(submit(&service, &slow), 0);
        let fast = Background {
            set: Some("fast"),
            trid: 2,
            ops: vec![put_op("x", 2)],
            ..Background::default()
        };
        assert_eq!(submit(&service, &fast), 0);
        let started = std::time::Instant::now();
        assert_eq!(
            wait_done(&service, 2, std::time::Duration::from_secs(2)),
            "done(ok)"
        );
        assert_eq!(show_value(&service, 2, "recs-succeeded"), "40");
        assert!(
            show_value(&service, 1, "status").starts_with("active"),
            "the paced job is still going after {:?}",
            started.elapsed()
        );
        let written = show_value(&service, 1, "recs-succeeded");
        assert!(
            written.parse::<u64>().unwrap() < 40,
            "paced at 10 a second: {written} written so far"
        );
        assert_eq!(info(&service, "query-abort:trid=1"), "ok");
        assert_eq!(
            wait_done(&service, 1, std::time::Duration::from_secs(2)),
            "done(user-aborted)"
        );
    });
    for key in 0..40 {
        assert_eq!(read(&service, "fast", &format!("f{key}"), "x"), Some(2));
    }
}

#[test]
fn jobs_past_the_active_limit_are_refused() {
    let (service, _) = service();
    // Paced at one record a second, each job stays active for a minute:
    // the limit fills however slowly the submissions go (with two records,
    // a loaded machine that took over a second to submit them all saw the
    // first jobs finish, and one more accepted).
    for key in 0..60 {
        put(&service, "demo", &format!("k{key}"), &[("n", key)], false);
    }
    with_runner(&service, || {
        // Each job writes its first record at once and waits a second for
        // each next one: all stay active while the limit fills.
        for trid in 1..=super::MAX_ACTIVE as u64 {
            let request = Background {
                set: Some("demo"),
                trid,
                rate: Some(1),
                ops: vec![put_op("x", 1)],
                ..Background::default()
            };
            assert_eq!(submit(&service, &request), 0, "job {trid}");
        }
        let one_more = Background {
            set: Some("demo"),
            trid: 999,
            ops: vec![put_op("x", 1)],
            ..Background::default()
        };
        assert_eq!(submit(&service, &one_more), 211);
        assert_eq!(
            info(&service, "query-show:trid=999"),
            "ERROR:2:job not found"
        );
        for trid in 1..=super::MAX_ACTIVE as u64 {
            info(&service, &format!("query-abort:trid={trid}"));
        }
        wait_done(
            &service,
            super::MAX_ACTIVE as u64,
            std::time::Duration::from_secs(5),
        );
    });
}

/// A UDF job naming a module this node does not have is accepted (as the
/// reference accepts it) and fails on each record: nothing is written, and
/// `query-show` counts the failures.
#[test]
fn a_udf_job_with_a_module_that_does_not_exist_fails_on_each_record() {
    let (service, _) = service();
    for key in 0..7 {
        put(&service, "demo", &format!("k{key}"), &[("n", key)], false);
    }
    let request = Background {
        set: Some("demo"),
        trid: 12,
        udf: Some(("absent", "f")),
        ..Background::default()
    };
    assert_eq!(submit(&service, &request), 0);
    assert_eq!(show_value(&service, 12, "status"), "done(ok)");
    assert_eq!(show_value(&service, 12, "recs-failed"), "7");
    assert_eq!(show_value(&service, 12, "recs-succeeded"), "0");
    for key in 0..7 {
        assert_eq!(read(&service, "demo", &format!("k{key}"), "n"), Some(key));
    }
}

/// A background job's `query-show` line has the reference's fields, in
/// its order (no `from` here: `Service::handle` knows no client address).
#[test]
fn a_background_jobs_line_has_the_references_fields() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("n", 1)], false);
    let keys = |trid: u64| -> String {
        info(&service, &format!("query-show:id={trid}"))
            .split(':')
            .map(|pair| pair.split_once('=').map_or(pair, |(key, _)| key))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let common = "trid ns set rps active-threads status job-progress run-time time-since-done \
        recs-throttled recs-filtered-meta recs-filtered-bins recs-succeeded recs-failed job-type \
        net-io-bytes socket-timeout";
    let ops = Background {
        set: Some("demo"),
        trid: 21,
        rate: Some(500),
        ops: vec![put_op("x", 1)],
        ..Background::default()
    };
    assert_eq!(submit(&service, &ops), 0);
    assert_eq!(keys(21), format!("{common} ops-active"));
    assert_eq!(show_value(&service, 21, "rps"), "500");
    assert_eq!(show_value(&service, 21, "recs-throttled"), "1");
    assert_eq!(show_value(&service, 21, "net-io-bytes"), "30");
    assert_eq!(show_value(&service, 21, "socket-timeout"), "10000");
    let udf = Background {
        set: Some("demo"),
        trid: 22,
        udf: Some(("m", "f")),
        ..Background::default()
    };
    assert_eq!(submit(&service, &udf), 0);
    assert_eq!(
        keys(22),
        format!("{common} udf-filename udf-function udf-active")
    );
    assert_eq!(show_value(&service, 22, "job-type"), "background-udf");
    assert_eq!(show_value(&service, 22, "udf-filename"), "m");
    assert_eq!(show_value(&service, 22, "udf-function"), "f");
}

/// A histogram's total count, by name: a `latencies:` one or (once its
/// group was turned on) a benchmark one from its dump.
fn histogram_total(service: &Service, name: &str) -> u64 {
    let latencies = service.latencies();
    if let Some(histogram) = latencies.histograms().iter().find(|h| h.name() == name) {
        return histogram.snapshot().total();
    }
    let prefix = format!("histogram dump: {name} (");
    latencies
        .benchmarks()
        .dump(latencies.unit())
        .iter()
        .find_map(|line| line.strip_prefix(&prefix)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no histogram {name}"))
}

/// A background job's record writes are sub-transactions, as the
/// reference (8.1.2, asked) counts them: in the `udf-sub` and `ops-sub`
/// benchmark groups (start, master, response; no replica here), never in
/// `{test}-write` or `{test}-udf`.
#[test]
fn a_jobs_writes_count_as_udf_sub_and_ops_sub_transactions() {
    use base64::Engine as _;
    let (service, _) = service();
    let source = b"function mark(rec) rec['m'] = 1 aerospike:update(rec) end";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    let put_module = format!(
        "udf-put:filename=sub_m.lua;content={content};content-len={};",
        content.len()
    );
    assert_eq!(info(&service, &put_module), "ok");
    for group in ["udf-sub", "ops-sub"] {
        let on = format!("set-config:context=namespace;id=test;enable-benchmarks-{group}=true");
        assert_eq!(info(&service, &on), "ok");
    }
    for key in 0..9 {
        put(&service, "demo", &format!("k{key}"), &[("n", key)], false);
    }
    let writes_before = histogram_total(&service, "{test}-write");
    let ops = Background {
        set: Some("demo"),
        trid: 31,
        ops: vec![put_op("flag", 1)],
        ..Background::default()
    };
    assert_eq!(submit(&service, &ops), 0);
    let udf = Background {
        set: Some("demo"),
        trid: 32,
        udf: Some(("sub_m", "mark")),
        ..Background::default()
    };
    assert_eq!(submit(&service, &udf), 0);
    assert_eq!(show_value(&service, 32, "recs-succeeded"), "9");
    assert_eq!(histogram_total(&service, "{test}-write"), writes_before);
    assert_eq!(histogram_total(&service, "{test}-udf"), 0);
    for group in ["udf-sub", "ops-sub"] {
        for stage in ["start", "master", "response"] {
            let name = format!("{{test}}-{group}-{stage}");
            assert_eq!(histogram_total(&service, &name), 9, "{name}");
        }
        for stage in ["restart", "dup-res", "repl-write"] {
            let name = format!("{{test}}-{group}-{stage}");
            assert_eq!(histogram_total(&service, &name), 0, "{name}");
        }
    }
}

/// `namespace/test`'s value of statistic `name`.
fn namespace_stat(service: &Service, name: &str) -> u64 {
    let answer = info(service, "namespace/test");
    answer
        .split(';')
        .find_map(|pair| pair.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in namespace/test"))
        .parse()
        .unwrap()
}

/// A job's record writes count in the `udf_sub_*` / `ops_sub_*`
/// statistics and in no `client_*` one. Each figure below is the
/// reference's (8.1.2) for the same jobs on the same records, asked side
/// by side: a UDF job over 10 records whose filter (n >= 5) turns 5 away,
/// one that only reads, one that removes, one whose function fails; an
/// ops job with the same filter, one whose op fails on every record.
#[test]
fn a_jobs_writes_count_in_the_sub_transaction_statistics() {
    use base64::Engine as _;
    let (service, _) = service();
    let source = b"function upd(rec) rec['m'] = 1 aerospike:update(rec) end
function rd(rec) return rec['n'] end
function del(rec) aerospike:remove(rec) end
function bad(rec) error('boom') end";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    let put_module = format!(
        "udf-put:filename=subs.lua;content={content};content-len={};",
        content.len()
    );
    assert_eq!(info(&service, &put_module), "ok");
    for set in ["a", "b", "c", "d", "e", "f"] {
        for key in 0..10 {
            put(&service, set, &format!("k{key}"), &[("n", key)], false);
        }
    }
    let client_writes = namespace_stat(&service, "client_write_success");
    // [GE, [BIN, INT, "n"], 5]
    let n_from_5 = vec![0x93, 0x04, 0x93, 0x51, 0x02, 0xa1, b'n', 0x05];
    let jobs = [("a", "upd"), ("b", "rd"), ("c", "del"), ("d", "bad")];
    for (trid, (set, function)) in (40..).zip(jobs) {
        let job = Background {
            set: Some(set),
            trid,
            filter: (set == "a").then(|| n_from_5.clone()),
            udf: Some(("subs", function)),
            ..Background::default()
        };
        assert_eq!(submit(&service, &job), 0, "{function}");
    }
    let filtered = Background {
        set: Some("e"),
        trid: 50,
        filter: Some(n_from_5),
        ops: vec![put_op("flag", 1)],
        ..Background::default()
    };
    assert_eq!(submit(&service, &filtered), 0);
    // An increment of a string bin fails on every record.
    let failing = Background {
        set: Some("f"),
        trid: 51,
        ops: vec![(op_type::INCR, 3, "n", b"x".to_vec())],
        ..Background::default()
    };
    assert_eq!(submit(&service, &failing), 0);
    assert_eq!(show_value(&service, 51, "recs-failed"), "10");
    let expected = [
        ("udf_sub_udf_complete", 25),
        ("udf_sub_udf_error", 10),
        ("udf_sub_udf_filtered_out", 5),
        ("udf_sub_lang_read_success", 10),
        ("udf_sub_lang_write_success", 5),
        ("udf_sub_lang_delete_success", 10),
        ("udf_sub_lang_error", 10),
        ("ops_sub_write_success", 5),
        ("ops_sub_write_error", 10),
        ("ops_sub_write_filtered_out", 5),
        ("udf_sub_tsvc_error", 0),
        ("ops_sub_tsvc_error", 0),
        ("client_write_success", client_writes),
        ("client_write_error", 0),
        ("client_write_filtered_out", 0),
        ("client_udf_complete", 0),
        ("client_udf_error", 0),
        ("client_lang_error", 0),
    ];
    for (name, value) in expected {
        assert_eq!(namespace_stat(&service, name), value, "{name}");
    }
}
