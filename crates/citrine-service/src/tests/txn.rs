//! A client transaction through `Service::handle`, frame by frame as the
//! official Java client sends it (`Command.setTxn*`, `TxnMonitor`,
//! `TxnRoll`: single-record reads and writes with fields 5/6/3, the
//! monitor record, batch verify and batch roll rows), on a namespace the
//! transaction path is enabled on for the test (strong-consistency
//! namespaces still answer 11 in the service).

use crate::batch::row_flags;
use crate::batch::tests::{batch_frame, digest, payload, put, run, service, single, Msg, RowSpec};
use crate::Service;
use citrine_data::txn::MONITOR_SET;
use citrine_wire::msg::{field_type, info1, info2, info3, op_type, MessageWriter, MsgHeader};
use citrine_wire::txn::info4;

const T: u64 = 0x5eed_0001;

/// A single-record command with transaction fields; its reply.
fn txn_single(
    service: &Service,
    header: MsgHeader,
    key: &str,
    fields: &[(u8, Vec<u8>)],
    ops: &[(u8, u8, &str, &[u8])],
) -> Msg {
    let (set, digest) = if key.starts_with("monitor") {
        (MONITOR_SET, citrine_data::txn::recovery::monitor_digest(T))
    } else {
        (&b"demo"[..], digest("demo", key))
    };
    let mut out = Vec::new();
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer
        .field(field_type::NAMESPACE, b"test")
        .field(field_type::SET, set)
        .field(field_type::DIGEST, &digest.0);
    for (kind, data) in fields {
        writer.field(*kind, data);
    }
    for (op, particle, bin, value) in ops {
        writer.op(*op, *particle, bin.as_bytes(), value);
    }
    writer.finish();
    let mut reply = run(service, &out);
    assert_eq!(reply.len(), 1);
    reply.remove(0)
}

fn header(info1: u8, info2: u8, info4: u8) -> MsgHeader {
    MsgHeader {
        info1,
        info2,
        info4,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    }
}

fn int(value: i64) -> [u8; 8] {
    value.to_be_bytes()
}

/// The rows of a batch reply and the code of its LAST message.
fn batch(service: &Service, rows: &[RowSpec]) -> (Vec<u8>, u8) {
    let reply = run(service, &batch_frame(&payload(rows, 0), false));
    let (last, rows) = reply.split_last().unwrap();
    assert_eq!(last.header.info3 & info3::LAST, info3::LAST);
    let codes = rows.iter().map(|row| row.header.result_code).collect();
    (codes, last.header.result_code)
}

/// A verify row (`setBatchTxnVerify`) of `key` at `version`.
fn verify_row(index: u32, key: &str, version: &[u8]) -> RowSpec {
    let info = [
        info1::READ | info1::GET_NO_BINS,
        0,
        info3::SC_READ_TYPE,
        info4::VERIFY_READ,
    ];
    RowSpec::full(
        index,
        "test",
        "demo",
        key,
        row_flags::INFO | row_flags::INFO4,
        info,
    )
    .field(field_type::RECORD_VERSION, version)
}

/// A roll row (`setBatchTxnRoll`) of `key`.
fn roll_row(index: u32, key: &str, bit: u8) -> RowSpec {
    let info = [0, info2::WRITE | info2::DURABLE_DELETE, 0, bit];
    RowSpec::full(
        index,
        "test",
        "demo",
        key,
        row_flags::INFO | row_flags::INFO4,
        info,
    )
    .field(field_type::TXN_ID, &T.to_le_bytes())
}

fn value_of(service: &Service, key: &str) -> Option<Vec<u8>> {
    let read = header(info1::READ | info1::GET_ALL, 0, 0);
    single(service, read, "demo", key, &[])
        .bin("v")
        .map(<[u8]>::to_vec)
}

#[test]
fn a_java_style_transaction_commits_through_the_service() {
    let (service, _) = service();
    service.namespace(b"test").unwrap().txn.enable_for_tests();
    for key in ["a", "b", "c"] {
        put(&service, "demo", key, &[("v", 1)], false);
    }
    let id = (field_type::TXN_ID, T.to_le_bytes().to_vec());
    // Reads inside the transaction: the versions to verify at commit.
    let read = header(info1::READ | info1::GET_ALL, 0, 0);
    let a = txn_single(&service, read, "a", std::slice::from_ref(&id), &[]);
    let c = txn_single(&service, read, "c", std::slice::from_ref(&id), &[]);
    let version_a = a.field(field_type::RECORD_VERSION).unwrap().to_vec();
    let version_c = c.field(field_type::RECORD_VERSION).unwrap().to_vec();
    // The monitor first (TxnAddKeys), then the write with the deadline.
    let keyds = citrine_cdt::value::to_bytes(&citrine_cdt::Value::List(citrine_cdt::value::List {
        flags: 1,
        items: vec![citrine_cdt::Value::Blob(4, digest("demo", "b").0.to_vec())],
    }));
    let monitor = txn_single(
        &service,
        header(0, info2::WRITE | info2::RESPOND_ALL_OPS, 0),
        "monitor",
        &[],
        &[
            (op_type::WRITE, 1, "id", &T.to_be_bytes()),
            (op_type::WRITE, 20, "keyds", &keyds),
        ],
    );
    assert_eq!(monitor.header.result_code, 0);
    let deadline = monitor.field(field_type::TXN_DEADLINE).unwrap().to_vec();
    let fields = [id.clone(), (field_type::TXN_DEADLINE, deadline)];
    let write = header(0, info2::WRITE, 0);
    let b = txn_single(
        &service,
        write,
        "b",
        &fields,
        &[(op_type::WRITE, 1, "v", &int(2))],
    );
    assert_eq!(b.header.result_code, 0);
    assert!(
        b.field(field_type::RECORD_VERSION).is_none(),
        "a write answers no version"
    );
    let other = single(
        &service,
        write,
        "demo",
        "b",
        &[(op_type::WRITE, 1, "v", &int(9))],
    );
    assert_eq!(other.header.result_code, 120);
    assert_eq!(
        value_of(&service, "b"),
        Some(int(1).to_vec()),
        "not committed yet"
    );

    // Commit: batch verify, mark roll-forward, batch roll, close.
    let verified = batch(
        &service,
        &[
            verify_row(0, "a", &version_a),
            verify_row(1, "c", &version_c),
        ],
    );
    assert_eq!(verified, (vec![0, 0], 0));
    let mark = txn_single(
        &service,
        write,
        "monitor",
        &[],
        &[(op_type::WRITE, 17, "fwd", &[1])],
    );
    assert_eq!(mark.header.result_code, 0);
    assert_eq!(
        batch(&service, &[roll_row(0, "b", info4::ROLL_FORWARD)]),
        (vec![0], 0)
    );
    let close = header(0, info2::WRITE | info2::DELETE | info2::DURABLE_DELETE, 0);
    assert_eq!(
        txn_single(&service, close, "monitor", &[], &[])
            .header
            .result_code,
        0
    );
    assert_eq!(value_of(&service, "b"), Some(int(2).to_vec()));

    let stats = crate::tests::info(&service, &["namespace/test"]);
    let stats = &stats[0].1;
    for expected in [
        "mrt_provisionals=0",
        "mrt_monitors_active=0",
        "mrt_verify_read_success=2",
    ] {
        assert!(
            stats.split(';').any(|item| item == expected),
            "{expected} in {stats}"
        );
    }
}

#[test]
fn a_changed_read_fails_verification_and_the_abort_restores() {
    let (service, _) = service();
    service.namespace(b"test").unwrap().txn.enable_for_tests();
    put(&service, "demo", "a", &[("v", 1)], false);
    put(&service, "demo", "b", &[("v", 1)], false);
    let id = (field_type::TXN_ID, T.to_le_bytes().to_vec());
    let read = header(info1::READ | info1::GET_ALL, 0, 0);
    let a = txn_single(&service, read, "a", std::slice::from_ref(&id), &[]);
    let version_a = a.field(field_type::RECORD_VERSION).unwrap().to_vec();
    let write = header(0, info2::WRITE, 0);
    let b = txn_single(
        &service,
        write,
        "b",
        &[id],
        &[(op_type::WRITE, 1, "v", &int(5))],
    );
    assert_eq!(b.header.result_code, 0);
    // Another client overwrites what the transaction read.
    let other = single(
        &service,
        write,
        "demo",
        "a",
        &[(op_type::WRITE, 1, "v", &int(7))],
    );
    assert_eq!(other.header.result_code, 0);
    assert_eq!(
        batch(&service, &[verify_row(0, "a", &version_a)]),
        (vec![121], 0)
    );
    assert_eq!(
        batch(&service, &[roll_row(0, "b", info4::ROLL_BACK)]),
        (vec![0], 0)
    );
    assert_eq!(
        value_of(&service, "b"),
        Some(int(1).to_vec()),
        "rolled back"
    );
    assert_eq!(value_of(&service, "a"), Some(int(7).to_vec()));
}

#[test]
fn transaction_settings_change_at_run_time_where_transactions_run() {
    let (service, _) = service();
    let ask = |command: &str| crate::tests::info(&service, &[command])[0].1.clone();
    let set = "set-config:context=namespace;id=test;mrt-duration=30;disable-mrt-writes=true";
    // As the CE reference answers on its namespaces.
    assert_eq!(ask(set), "ERROR:4:invalid set-config parameter");
    service.namespace(b"test").unwrap().txn.enable_for_tests();
    assert_eq!(ask(set), "ok");
    let config = ask("get-config:context=namespace;id=test");
    for expected in ["mrt-duration=30", "disable-mrt-writes=true"] {
        assert!(
            config.split(';').any(|item| item == expected),
            "{expected} in {config}"
        );
    }
    for bad in ["mrt-duration=0", "mrt-duration=121", "disable-mrt-writes=1"] {
        let command = format!("set-config:context=namespace;id=test;{bad}");
        assert_eq!(
            ask(&command),
            "ERROR:4:invalid set-config parameter",
            "{bad}"
        );
    }
    let write = header(0, info2::WRITE, 0);
    let id = (field_type::TXN_ID, T.to_le_bytes().to_vec());
    let refused = txn_single(
        &service,
        write,
        "a",
        &[id],
        &[(op_type::WRITE, 1, "v", &int(1))],
    );
    assert_eq!(refused.header.result_code, 22, "disable-mrt-writes");
}

/// Registers `txn_udf.lua`: `write_bin(rec, name, value)` stores a bin.
fn register_write_bin(service: &Service) {
    use base64::Engine as _;
    let source = b"function write_bin(rec, name, value)\n  rec[name] = value\n  \
        if aerospike:exists(rec) then aerospike:update(rec) else aerospike:create(rec) end\n  \
        return 0\nend\n";
    let content = base64::engine::general_purpose::STANDARD.encode(source);
    let command = format!(
        "udf-put:filename=txn_udf.lua;content={content};content-len={};",
        content.len()
    );
    assert_eq!(crate::tests::info(service, &[command.as_str()])[0].1, "ok");
}

#[test]
fn a_record_udf_inside_a_transaction_writes_a_provisional_version() {
    use citrine_cdt::value::{to_bytes, List, Value};
    let (service, _) = service();
    service.namespace(b"test").unwrap().txn.enable_for_tests();
    register_write_bin(&service);
    put(&service, "demo", "a", &[("v", 1)], false);
    let args = to_bytes(&Value::List(List {
        flags: 0,
        items: vec![Value::str("v"), Value::Int(5)],
    }));
    let call = |txn: Option<u64>| {
        let mut fields = vec![
            (field_type::UDF_FILENAME, b"txn_udf".to_vec()),
            (field_type::UDF_FUNCTION, b"write_bin".to_vec()),
            (field_type::UDF_ARGLIST, args.clone()),
        ];
        if let Some(txn) = txn {
            fields.push((field_type::TXN_ID, txn.to_le_bytes().to_vec()));
        }
        txn_single(&service, header(0, info2::WRITE, 0), "a", &fields, &[])
    };
    assert_eq!(call(Some(T)).header.result_code, 0);
    assert_eq!(
        value_of(&service, "a"),
        Some(int(1).to_vec()),
        "committed unchanged"
    );
    assert_eq!(call(None).header.result_code, 120, "a plain UDF is blocked");
    assert_eq!(
        call(Some(T + 1)).header.result_code,
        120,
        "so is another txn's"
    );
    let id = (field_type::TXN_ID, T.to_le_bytes().to_vec());
    let own = txn_single(
        &service,
        header(info1::READ | info1::GET_ALL, 0, 0),
        "a",
        &[id],
        &[],
    );
    assert_eq!(
        own.bin("v"),
        Some(&int(5)[..]),
        "the transaction sees its write"
    );
    assert_eq!(
        batch(&service, &[roll_row(0, "a", info4::ROLL_FORWARD)]),
        (vec![0], 0)
    );
    assert_eq!(value_of(&service, "a"), Some(int(5).to_vec()));
}

#[test]
fn batch_rows_inside_a_transaction_answer_versions_and_write_provisionally() {
    let (service, _) = service();
    service.namespace(b"test").unwrap().txn.enable_for_tests();
    put(&service, "demo", "a", &[("v", 1)], false);
    put(&service, "demo", "b", &[("v", 1)], false);
    let flags = row_flags::INFO | row_flags::INFO4;
    let read_row = |index: u32, key: &str| {
        RowSpec::full(
            index,
            "test",
            "demo",
            key,
            flags,
            [info1::READ | info1::GET_ALL, 0, 0, 0],
        )
        .field(field_type::TXN_ID, &T.to_le_bytes())
    };
    let reply = run(
        &service,
        &batch_frame(&payload(&[read_row(0, "a"), read_row(1, "b")], 0x04), false),
    );
    let (last, rows) = reply.split_last().unwrap();
    assert_eq!(last.header.result_code, 0);
    assert!(rows
        .iter()
        .all(|row| row.field(field_type::RECORD_VERSION).map(<[u8]>::len) == Some(7)));
    let write_row = |index: u32, key: &str| {
        RowSpec::full(index, "test", "demo", key, flags, [0, info2::WRITE, 0, 0])
            .field(field_type::TXN_ID, &T.to_le_bytes())
            .op(op_type::WRITE, 1, "v", &int(9))
    };
    let written = batch(&service, &[write_row(0, "a"), write_row(1, "b")]);
    assert_eq!(written, (vec![0, 0], 0));
    assert_eq!(
        value_of(&service, "a"),
        Some(int(1).to_vec()),
        "provisional"
    );
    let rolls = [
        roll_row(0, "a", info4::ROLL_BACK),
        roll_row(1, "b", info4::ROLL_FORWARD),
    ];
    assert_eq!(batch(&service, &rolls), (vec![0, 0], 0));
    assert_eq!(value_of(&service, "a"), Some(int(1).to_vec()));
    assert_eq!(value_of(&service, "b"), Some(int(9).to_vec()));
}
