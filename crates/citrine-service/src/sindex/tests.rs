//! Secondary-index tests through `Service::handle`: the info commands, the
//! build of an index over records already stored, maintenance on every
//! path that changes a record, queries (ranges, equality, collections,
//! sets, resume, once per record) and the definitions file.

#![allow(clippy::unwrap_used)]

use crate::batch::tests::{put, run, service, single, Msg};
use crate::Service;
use citrine_types::{Digest, DIGEST_SIZE};
use citrine_wire::msg::{field_type, info1, info2, info3, op_type, MessageWriter, MsgHeader};
use std::collections::BTreeSet;

pub(crate) fn info(service: &Service, command: &str) -> String {
    let mut answers = crate::tests::info(service, &[command]);
    assert_eq!(answers.len(), 1);
    let (line, value) = answers.remove(0);
    assert_eq!(line, command);
    value
}

/// Writes one bin of any particle.
pub(crate) fn put_particle(
    service: &Service,
    set: &str,
    key: &str,
    bin: &str,
    particle: u8,
    value: &[u8],
) {
    let header = MsgHeader {
        info2: info2::WRITE,
        ..MsgHeader::default()
    };
    let reply = single(
        service,
        header,
        set,
        key,
        &[(op_type::WRITE, particle, bin, value)],
    );
    assert_eq!(reply.header.result_code, 0);
}

fn delete(service: &Service, set: &str, key: &str) {
    let header = MsgHeader {
        info2: info2::WRITE | info2::DELETE,
        ..MsgHeader::default()
    };
    assert_eq!(single(service, header, set, key, &[]).header.result_code, 0);
}

/// The INDEX_RANGE payload of an integer range.
pub(crate) fn int_range(bin: &str, begin: i64, end: i64) -> Vec<u8> {
    range(bin, 1, &begin.to_be_bytes(), &end.to_be_bytes())
}

fn range(bin: &str, particle: u8, begin: &[u8], end: &[u8]) -> Vec<u8> {
    let mut out = vec![1, bin.len() as u8];
    out.extend_from_slice(bin.as_bytes());
    out.push(particle);
    out.extend_from_slice(&(begin.len() as u32).to_be_bytes());
    out.extend_from_slice(begin);
    out.extend_from_slice(&(end.len() as u32).to_be_bytes());
    out.extend_from_slice(end);
    out
}

#[derive(Default)]
struct QuerySpec<'a> {
    set: Option<&'a str>,
    range: Vec<u8>,
    fields: Vec<(u8, Vec<u8>)>,
    max_records: Option<u64>,
    /// Resume points: (digest, bval).
    resume: Vec<(Digest, i64)>,
}

/// Runs a query; answers its records and the LAST message's result code.
fn query(service: &Service, spec: &QuerySpec<'_>) -> (Vec<Msg>, u8) {
    let mut out = Vec::new();
    let header = MsgHeader {
        info1: info1::READ,
        info3: info3::PARTITION_DONE,
        transaction_ttl: 1000,
        ..MsgHeader::default()
    };
    let mut writer = MessageWriter::begin(&mut out, &header);
    writer.field(field_type::NAMESPACE, b"test");
    if let Some(set) = spec.set {
        writer.field(field_type::SET, set.as_bytes());
    }
    writer.field(field_type::TASK_ID, &7u64.to_be_bytes());
    writer.field(field_type::INDEX_RANGE, &spec.range);
    for (kind, data) in &spec.fields {
        writer.field(*kind, data);
    }
    if !spec.resume.is_empty() {
        let digests: Vec<u8> = spec.resume.iter().flat_map(|(d, _)| d.0).collect();
        let bvals: Vec<u8> = spec
            .resume
            .iter()
            .flat_map(|(_, b)| b.to_le_bytes())
            .collect();
        writer.field(field_type::DIGEST_ARRAY, &digests);
        writer.field(field_type::BVAL_ARRAY, &bvals);
    }
    if let Some(limit) = spec.max_records {
        writer.field(field_type::MAX_RECORDS, &limit.to_be_bytes());
    }
    writer.finish();
    let mut messages = run(service, &out);
    let last = messages.pop().unwrap();
    assert_eq!(last.header.info3, info3::LAST);
    (messages, last.header.result_code)
}

fn digest_of(message: &Msg) -> Digest {
    let mut bytes = [0u8; DIGEST_SIZE];
    bytes.copy_from_slice(message.field(field_type::DIGEST).unwrap());
    Digest(bytes)
}

fn bval_of(message: &Msg) -> i64 {
    i64::from_le_bytes(
        message
            .field(field_type::BVAL_ARRAY)
            .unwrap()
            .try_into()
            .unwrap(),
    )
}

fn ints(messages: &[Msg], bin: &str) -> BTreeSet<i64> {
    messages
        .iter()
        .map(|message| i64::from_be_bytes(message.bin(bin).unwrap().try_into().unwrap()))
        .collect()
}

#[test]
fn info_commands_create_list_describe_and_delete() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("n", 1)], false);
    let create = "sindex-create:ns=test;set=demo;indexname=idx_n;indexdata=n,NUMERIC";
    assert_eq!(info(&service, create), "ok");
    // The same definition again: ok; another under that name: 200.
    assert_eq!(info(&service, create), "ok");
    assert!(info(
        &service,
        "sindex-create:namespace=test;indexname=idx_n;bin=m;type=NUMERIC"
    )
    .starts_with("ERROR:200:"));
    // A namespace this node does not have: ok and nothing created, as the
    // reference answers; the client's sindex-stat then gets 20.
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=nope;indexname=x;bin=m;type=NUMERIC"
        ),
        "ok"
    );
    // A set index names its set.
    assert!(info(
        &service,
        "sindex-create:ns=test;indexname=g;bin=m;type=NUMERIC;indextype=SET"
    )
    .starts_with("ERROR:4:"));
    assert_eq!(
        info(&service, "sindex-exists:ns=test;indexname=idx_n"),
        "true"
    );
    assert_eq!(
        info(&service, "sindex-exists:namespace=test;indexname=other"),
        "false"
    );
    let listing = info(&service, "sindex");
    assert_eq!(
        listing,
        "ns=test:indexname=idx_n:set=demo:bin=n:type=numeric:indextype=default:context=null:exp=null:state=RW"
    );
    assert_eq!(info(&service, "sindex/test"), listing);
    assert_eq!(info(&service, "sindex/other"), "ns_type=unknown");
    assert_eq!(info(&service, "sindex/other/idx_n"), "ns_type=unknown");
    let stat = info(&service, "sindex/test/idx_n");
    assert!(stat.contains("entries=1;"), "{stat}");
    assert!(stat.contains("load_pct=100;"), "{stat}");
    assert_eq!(
        stat,
        info(&service, "sindex-stat:namespace=test;indexname=idx_n")
    );
    assert!(info(&service, "sets/test/demo").contains(":sindexes=1:"));
    assert_eq!(
        info(&service, "sindex-delete:ns=test;set=demo;indexname=idx_n"),
        "ok"
    );
    assert!(info(&service, "sindex/test/idx_n").starts_with("ERROR:201:"));
    // Deleting what is not there is ok, as the 8.x reference answers.
    assert_eq!(
        info(&service, "sindex-delete:ns=test;indexname=idx_n"),
        "ok"
    );
    assert_eq!(info(&service, "sindex"), "");
}

#[test]
fn index_commands_refuse_missing_or_empty_names_and_create_nothing() {
    let (service, _) = service();
    let long_ns = "n".repeat(50);
    let long_set = "s".repeat(100);
    for (command, expected) in [
        (
            "sindex-create:indexname=i;indexdata=b,numeric".to_owned(),
            "ERROR:20:missing 'namespace'",
        ),
        (
            "sindex-create:ns=;indexname=i;indexdata=b,numeric".to_owned(),
            "ERROR:20:missing 'namespace' value",
        ),
        (
            format!("sindex-create:ns={long_ns};indexname=i;indexdata=b,numeric"),
            "ERROR:20:'namespace' value too long",
        ),
        (
            "sindex-create:ns=test;indexdata=b,numeric".to_owned(),
            "ERROR:4:missing 'indexname'",
        ),
        (
            "sindex-create:ns=test;indexname=;indexdata=b,numeric".to_owned(),
            "ERROR:4:missing 'indexname' value",
        ),
        // An empty set is not "the whole namespace".
        (
            "sindex-create:ns=test;set=;indexname=i;indexdata=b,numeric".to_owned(),
            "ERROR:4:missing 'set' value",
        ),
        (
            format!("sindex-create:ns=test;set={long_set};indexname=i;indexdata=b,numeric"),
            "ERROR:4:'set' value too long",
        ),
        (
            "sindex-delete:ns=;indexname=i".to_owned(),
            "ERROR:20:missing 'namespace' value",
        ),
        (
            "sindex-delete:ns=test;indexname=".to_owned(),
            "ERROR:4:missing 'indexname' value",
        ),
        ("sindex-delete:ns=nope;indexname=i".to_owned(), "ok"),
        (
            "sindex-exists:ns=nope;indexname=i".to_owned(),
            "ERROR:20:namespace not found on node",
        ),
        (
            "sindex-exists:ns=test".to_owned(),
            "ERROR:4:missing 'indexname'",
        ),
        (
            "sindex-stat:namespace=nope;indexname=i".to_owned(),
            "ERROR:20:namespace not found on node",
        ),
        (
            "sindex-stat:namespace=test;indexname=i".to_owned(),
            "ERROR:201:no index",
        ),
        (
            "sindex-list:ns=nope".to_owned(),
            "ERROR:20:namespace not found on node",
        ),
    ] {
        assert_eq!(info(&service, &command), expected, "{command}");
    }
    assert_eq!(info(&service, "sindex"), "");
}

#[test]
fn a_query_sees_records_written_before_and_after_the_index_and_follows_every_change() {
    let (service, clock) = service();
    for key in 0..50 {
        put(&service, "demo", &format!("k{key}"), &[("n", key)], false);
    }
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=test;indexname=n;bin=n;type=NUMERIC"
        ),
        "ok"
    );
    for key in 50..100 {
        put(&service, "demo", &format!("k{key}"), &[("n", key)], false);
    }
    let spec = QuerySpec {
        range: int_range("n", 40, 59),
        ..QuerySpec::default()
    };
    let (records, code) = query(&service, &spec);
    assert_eq!(code, 0);
    assert_eq!(ints(&records, "n"), (40..60).collect());
    assert!(records.iter().all(|record| bval_of(record)
        == i64::from_be_bytes(record.bin("n").unwrap().try_into().unwrap())));

    // An update moves the record, a delete removes it, a bin of another
    // type leaves the index.
    put(&service, "demo", "k45", &[("n", 1000)], false);
    delete(&service, "demo", "k46");
    put_particle(&service, "demo", "k47", "n", 3, b"text");
    let (records, _) = query(&service, &spec);
    let expected: BTreeSet<i64> = (40..60).filter(|n| ![45, 46, 47].contains(n)).collect();
    assert_eq!(ints(&records, "n"), expected);
    let (moved, _) = query(
        &service,
        &QuerySpec {
            range: int_range("n", 1000, 1000),
            ..QuerySpec::default()
        },
    );
    assert_eq!(moved.len(), 1);
    let stat = info(&service, "sindex/test/n");
    assert!(stat.contains("entries=98;"), "{stat}");

    // Truncation empties it.
    clock.advance_ms(1);
    assert_eq!(info(&service, "truncate:namespace=test;set=demo"), "ok");
    assert!(info(&service, "sindex/test/n").contains("entries=0;"));
    assert!(query(&service, &spec).0.is_empty());
}

#[test]
fn expiry_removes_entries() {
    let (service, clock) = service();
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=test;indexname=n;bin=n;type=NUMERIC"
        ),
        "ok"
    );
    let header = MsgHeader {
        info2: info2::WRITE,
        record_ttl: 10,
        ..MsgHeader::default()
    };
    let five = 5i64.to_be_bytes();
    let reply = single(
        &service,
        header,
        "demo",
        "short",
        &[(op_type::WRITE, 1, "n", &five)],
    );
    assert_eq!(reply.header.result_code, 0);
    let spec = QuerySpec {
        range: int_range("n", 5, 5),
        ..QuerySpec::default()
    };
    assert_eq!(query(&service, &spec).0.len(), 1);
    clock.advance_ms(11_000);
    // Expired: not returned even before nsup runs, and gone after.
    assert!(query(&service, &spec).0.is_empty());
    let namespace = service.namespace(b"test").unwrap();
    crate::nsup::run_pass(namespace, service.now());
    assert!(info(&service, "sindex/test/n").contains("entries=0;"));
}

#[test]
fn queries_pick_the_index_by_set_type_and_name_and_answer_201_without_one() {
    let (service, _) = service();
    for key in 0..10 {
        put_particle(
            &service,
            "a",
            &format!("x{key}"),
            "s",
            3,
            format!("v{}", key % 3).as_bytes(),
        );
        put_particle(
            &service,
            "b",
            &format!("y{key}"),
            "s",
            3,
            format!("v{}", key % 3).as_bytes(),
        );
    }
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=test;indexname=s_all;bin=s;type=STRING"
        ),
        "ok"
    );
    let equal = |value: &str| range("s", 3, value.as_bytes(), value.as_bytes());
    // v0: keys 0, 3, 6, 9 in each set.
    let (all, code) = query(
        &service,
        &QuerySpec {
            range: equal("v0"),
            ..QuerySpec::default()
        },
    );
    assert_eq!((all.len(), code), (8, 0));
    let (only_a, _) = query(
        &service,
        &QuerySpec {
            set: Some("a"),
            range: equal("v0"),
            ..QuerySpec::default()
        },
    );
    assert_eq!(only_a.len(), 4);
    assert!(only_a
        .iter()
        .all(|record| record.field(field_type::SET) == Some(&b"a"[..])));
    // An integer filter on a string index, an unknown bin: no such index.
    let (_, code) = query(
        &service,
        &QuerySpec {
            range: int_range("s", 0, 1),
            ..QuerySpec::default()
        },
    );
    assert_eq!(code, 201);
    let (_, code) = query(
        &service,
        &QuerySpec {
            range: int_range("nope", 0, 1),
            ..QuerySpec::default()
        },
    );
    assert_eq!(code, 201);
    // By name, whatever the filter's bin.
    let (named, _) = query(
        &service,
        &QuerySpec {
            range: range("", 3, b"v1", b"v1"),
            fields: vec![(field_type::INDEX_NAME, b"s_all".to_vec())],
            ..QuerySpec::default()
        },
    );
    assert_eq!(named.len(), 6);
    // A malformed filter: 4. A geo filter that is not GeoJSON: 4.
    let (_, code) = query(
        &service,
        &QuerySpec {
            range: vec![1, 1],
            ..QuerySpec::default()
        },
    );
    assert_eq!(code, 4);
    let (_, code) = query(
        &service,
        &QuerySpec {
            range: range("s", 23, b"{}", b"{}"),
            ..QuerySpec::default()
        },
    );
    assert_eq!(code, 4);
}

#[test]
fn a_list_index_returns_each_record_once() {
    let (service, _) = service();
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=test;indexname=l;indextype=LIST;bin=l;type=NUMERIC"
        ),
        "ok"
    );
    // [1, 2, 3, "x"] and [3, 4]
    put_particle(
        &service,
        "demo",
        "one",
        "l",
        20,
        &[0x94, 1, 2, 3, 0xa2, 3, b'x'],
    );
    put_particle(&service, "demo", "two", "l", 20, &[0x92, 3, 4]);
    let (records, _) = query(
        &service,
        &QuerySpec {
            range: int_range("l", 1, 4),
            fields: vec![(field_type::INDEX_TYPE, vec![1])],
            ..QuerySpec::default()
        },
    );
    assert_eq!(records.len(), 2);
    let (records, _) = query(
        &service,
        &QuerySpec {
            range: int_range("l", 3, 3),
            fields: vec![(field_type::INDEX_TYPE, vec![1])],
            ..QuerySpec::default()
        },
    );
    assert_eq!(records.len(), 2);
    assert!(info(&service, "sindex/test/l").contains("entries=5;"));
    // Without the collection type the query names another index: none.
    let (_, code) = query(
        &service,
        &QuerySpec {
            range: int_range("l", 3, 3),
            ..QuerySpec::default()
        },
    );
    assert_eq!(code, 201);
}

#[test]
fn a_query_resumes_strictly_after_its_bval_and_digest() {
    let (service, _) = service();
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=test;indexname=n;bin=n;type=NUMERIC"
        ),
        "ok"
    );
    // 20 000 records with 7 values: every partition holds several records,
    // and records of a partition share bvals.
    for key in 0..20_000 {
        put(
            &service,
            "demo",
            &format!("r{key}"),
            &[("n", key % 7)],
            false,
        );
    }
    let spec = QuerySpec {
        range: int_range("n", 2, 5),
        ..QuerySpec::default()
    };
    let (all, code) = query(&service, &spec);
    assert_eq!(code, 0);
    let expected = (0..20_000)
        .filter(|key| (2..=5).contains(&(key % 7)))
        .count();
    assert_eq!(all.len(), expected);
    assert_eq!(
        all.iter().map(digest_of).collect::<BTreeSet<_>>().len(),
        expected,
        "each record once"
    );
    // Within a partition, records come in (bval, digest) order.
    let mut by_partition: std::collections::BTreeMap<_, Vec<(i64, Digest)>> =
        std::collections::BTreeMap::new();
    for record in &all {
        let digest = digest_of(record);
        by_partition
            .entry(digest.partition())
            .or_default()
            .push((bval_of(record), digest));
    }
    for entries in by_partition.values() {
        assert!(entries.windows(2).all(|pair| pair[0] < pair[1]));
    }
    // Resuming one partition after any of its records returns exactly the
    // records after it, in order.
    let (partition, entries) = by_partition
        .iter()
        .find(|(_, entries)| entries.len() >= 4)
        .unwrap();
    for cut in 0..entries.len() {
        let (bval, digest) = entries[cut];
        let (rest, code) = query(
            &service,
            &QuerySpec {
                resume: vec![(digest, bval)],
                ..QuerySpec {
                    range: spec.range.clone(),
                    ..QuerySpec::default()
                }
            },
        );
        assert_eq!(code, 0);
        let got: Vec<(i64, Digest)> = rest
            .iter()
            .map(|record| (bval_of(record), digest_of(record)))
            .collect();
        assert!(got
            .iter()
            .all(|(_, digest)| digest.partition() == *partition));
        assert_eq!(got, entries[cut + 1..].to_vec(), "resume after {cut}");
    }
    // A record limit stops the stream there.
    let (limited, code) = query(
        &service,
        &QuerySpec {
            max_records: Some(37),
            range: spec.range.clone(),
            ..QuerySpec::default()
        },
    );
    assert_eq!((limited.len(), code), (37, 0));
    // Bvals must come with digests, one each.
    let mut bad = QuerySpec {
        range: spec.range.clone(),
        ..QuerySpec::default()
    };
    bad.fields
        .push((field_type::DIGEST_ARRAY, entries[0].1 .0.to_vec()));
    assert_eq!(query(&service, &bad).1, 4);
}

#[test]
fn definitions_are_kept_and_restored_with_their_entries() {
    let directory = std::env::temp_dir().join(format!(
        "citrine-sindex-test-{}-{}",
        std::process::id(),
        line!()
    ));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).unwrap();
    let (first, _) = service();
    first.keep_sindex_definitions(&directory).unwrap();
    assert_eq!(
        info(
            &first,
            "sindex-create:ns=test;set=demo;indexname=n;bin=n;type=NUMERIC"
        ),
        "ok"
    );
    assert_eq!(
        info(
            &first,
            "sindex-create:ns=test;indexname=s;bin=s;type=STRING;indextype=MAPKEYS"
        ),
        "ok"
    );
    let text = std::fs::read_to_string(directory.join(super::DEFINITIONS_FILE)).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    // A new process over the same records (a memory namespace starts
    // empty, so write them again before restoring the definitions).
    let (second, _) = service();
    for key in 0..5 {
        put(&second, "demo", &format!("k{key}"), &[("n", key)], false);
    }
    second.keep_sindex_definitions(&directory).unwrap();
    let listing = info(&second, "sindex");
    assert!(
        listing.contains("indexname=n:set=demo:bin=n:type=numeric"),
        "{listing}"
    );
    assert!(
        listing.contains("indexname=s:set=null:bin=s:type=string:indextype=mapkeys"),
        "{listing}"
    );
    let (records, _) = query(
        &second,
        &QuerySpec {
            set: Some("demo"),
            range: int_range("n", 0, 4),
            ..QuerySpec::default()
        },
    );
    assert_eq!(records.len(), 5);
    assert_eq!(info(&second, "sindex-delete:ns=test;indexname=s"), "ok");
    // The deleted index stays as a tombstone (so a peer that missed the
    // delete cannot bring it back).
    let text = std::fs::read_to_string(directory.join(super::DEFINITIONS_FILE)).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert_eq!(
        text.lines()
            .filter(|line| line.contains("deleted=true;"))
            .count(),
        1,
        "{text}"
    );
    assert!(
        text.lines().all(|line| line.starts_with("version=")),
        "{text}"
    );
    // A change the file cannot keep (its place is taken by a directory) is
    // refused and not made: it would be gone after a restart.
    let file = directory.join(super::DEFINITIONS_FILE);
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir_all(file.join("in-the-way")).unwrap();
    let refused = info(
        &second,
        "sindex-create:ns=test;indexname=t;bin=t;type=NUMERIC",
    );
    assert!(refused.starts_with("ERROR:1:"), "{refused}");
    let refused = info(&second, "sindex-delete:ns=test;indexname=n");
    assert!(refused.starts_with("ERROR:1:"), "{refused}");
    let listing = info(&second, "sindex");
    assert!(!listing.contains("indexname=t:"), "{listing}");
    assert!(listing.contains("indexname=n:"), "{listing}");
    std::fs::remove_dir_all(&directory).unwrap();
}

#[test]
fn an_index_still_building_answers_203_and_a_new_name_renames() {
    let (service, _) = service();
    put(&service, "demo", "a", &[("n", 1)], false);
    // Registered but not built (as while the builder thread works on it).
    let namespace = service.namespace(b"test").unwrap();
    let def = citrine_sindex::SindexDef::parse(citrine_sindex::def::params(
        "ns=test;indexname=pending;bin=n;type=NUMERIC",
    ))
    .unwrap();
    assert!(matches!(
        service.sindexes(namespace).create(def),
        Ok(citrine_sindex::Created::New(_))
    ));
    assert!(info(&service, "sindex").contains("indexname=pending:"));
    assert!(info(&service, "sindex").ends_with(":state=WO"));
    assert!(info(&service, "sindex/test/pending").contains("load_pct=0;"));
    let spec = QuerySpec {
        range: int_range("n", 0, 9),
        ..QuerySpec::default()
    };
    assert_eq!(query(&service, &spec).1, 203);
    assert_eq!(
        info(&service, "sindex-delete:ns=test;indexname=pending"),
        "ok"
    );

    // The same definition under a new name: the index is renamed.
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=test;indexname=old;bin=n;type=NUMERIC"
        ),
        "ok"
    );
    assert_eq!(
        info(
            &service,
            "sindex-create:ns=test;indexname=new;bin=n;type=NUMERIC"
        ),
        "ok"
    );
    assert_eq!(
        info(&service, "sindex-exists:ns=test;indexname=old"),
        "false"
    );
    assert!(info(&service, "sindex/test/new").contains("entries=1;"));
    assert_eq!(query(&service, &spec).0.len(), 1);
}
