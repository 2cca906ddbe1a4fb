//! Tests of one index's trees and of the registry's rules.

use super::*;
use crate::def::params;

fn def(text: &str) -> SindexDef {
    SindexDef::parse(params(text)).expect("definition")
}

fn digest(first: u8, partition_byte: u8) -> Digest {
    let mut bytes = [0u8; DIGEST_SIZE];
    bytes[0] = partition_byte;
    bytes[19] = first;
    Digest(bytes)
}

#[test]
fn updates_move_a_record_between_keys() {
    let index = Sindex::new(def("ns=t;indexname=i;bin=b;type=NUMERIC")).expect("index");
    let d = digest(1, 7);
    index.update(&d, &[], &[Key::Int(5), Key::Int(9)]);
    assert_eq!(index.entries(), 2);
    index.update(
        &d,
        &[Key::Int(5), Key::Int(9)],
        &[Key::Int(9), Key::Int(11)],
    );
    assert_eq!(index.entries(), 2);
    let mut out = Vec::new();
    index.candidates(d.partition(), &[(0, 100)], None, usize::MAX, &mut out);
    assert_eq!(out, vec![(9, d), (11, d)]);
    index.update(&d, &[Key::Int(9), Key::Int(11)], &[]);
    assert_eq!(index.entries(), 0);
}

#[test]
fn candidates_are_ordered_bounded_and_resume_strictly_after() {
    let index = Sindex::new(def("ns=t;indexname=i;bin=b;type=NUMERIC")).expect("index");
    let (a, b, c) = (digest(1, 3), digest(2, 3), digest(3, 3));
    index.update(&a, &[], &[Key::Int(10)]);
    index.update(&b, &[], &[Key::Int(10)]);
    index.update(&c, &[], &[Key::Int(-4)]);
    let partition = a.partition();
    let mut out = Vec::new();
    index.candidates(
        partition,
        &[(i64::MIN, i64::MAX)],
        None,
        usize::MAX,
        &mut out,
    );
    assert_eq!(out, vec![(-4, c), (10, a), (10, b)]);
    out.clear();
    index.candidates(
        partition,
        &[(i64::MIN, i64::MAX)],
        Some((10, a)),
        usize::MAX,
        &mut out,
    );
    assert_eq!(out, vec![(10, b)]);
    out.clear();
    // A resume point below the range starts at the range.
    index.candidates(partition, &[(0, 10)], Some((-100, c)), 1, &mut out);
    assert_eq!(out, vec![(10, a)]);
    out.clear();
    index.candidates(partition, &[(0, 10)], Some((10, b)), usize::MAX, &mut out);
    assert!(out.is_empty());
    index.candidates(partition, &[(11, 10)], None, usize::MAX, &mut out);
    assert!(out.is_empty());
    // Several ranges: in order, the resume point skipping what is behind
    // it, the limit counted over all of them.
    index.candidates(partition, &[(-5, -4), (10, 10)], None, usize::MAX, &mut out);
    assert_eq!(out, vec![(-4, c), (10, a), (10, b)]);
    out.clear();
    index.candidates(partition, &[(-5, -4), (10, 10)], Some((-4, c)), 1, &mut out);
    assert_eq!(out, vec![(10, a)]);
    out.clear();
    index.candidates(partition, &[(-5, -4), (9, 9)], None, usize::MAX, &mut out);
    assert_eq!(out, vec![(-4, c)]);
    out.clear();
    assert!(out.is_empty());
    index.clear_partition(partition);
    assert_eq!(index.entries(), 0);
}

#[test]
fn registry_rules_follow_the_reference() {
    let registry = Registry::default();
    assert!(registry.is_empty());
    let first = def("ns=t;indexname=i;bin=b;type=NUMERIC");
    assert!(matches!(
        registry.create(first.clone()),
        Ok(Created::New(_))
    ));
    assert!(matches!(registry.create(first), Ok(Created::Exists)));
    let redefined = def("ns=t;indexname=i;bin=c;type=NUMERIC");
    assert_eq!(
        registry.create(redefined).map(|_| ()).map_err(|e| e.code),
        Err(200)
    );
    for n in 1..MAX_INDEXES {
        let text = format!("ns=t;indexname=x{n};bin=b{n};type=STRING");
        assert!(matches!(registry.create(def(&text)), Ok(Created::New(_))));
    }
    let over = def("ns=t;indexname=over;bin=z;type=STRING");
    assert_eq!(
        registry.create(over).map(|_| ()).map_err(|e| e.code),
        Err(206)
    );
    // The same definition under another name renames the index, keeping
    // its entries.
    let digest = digest(1, 2);
    registry
        .get("i")
        .expect("i")
        .update(&digest, &[], &[Key::Int(3)]);
    let renamed = def("ns=t;indexname=j;bin=b;type=NUMERIC");
    assert!(matches!(registry.create(renamed), Ok(Created::Renamed(old)) if old == "i"));
    assert!(registry.get("i").is_none());
    assert_eq!(registry.get("j").expect("renamed").entries(), 1);
    let gone = registry.delete("j").expect("deleted");
    assert!(gone.is_dropped());
    assert!(registry.delete("j").is_none());
    assert_eq!(registry.len(), MAX_INDEXES - 1);
}

#[test]
fn a_query_finds_the_set_index_first_then_the_namespace_one() {
    let registry = Registry::default();
    for text in [
        "ns=t;indexname=all;bin=b;type=NUMERIC",
        "ns=t;set=s;indexname=on_s;bin=b;type=NUMERIC",
        "ns=t;indexname=list;bin=b;type=NUMERIC;indextype=LIST",
    ] {
        registry.create(def(text)).expect("created");
    }
    let lookup = Lookup {
        name: None,
        expression: None,
        bin: b"b",
        key_type: KeyType::Numeric,
        collection: CollectionType::Default,
        context: None,
    };
    let name = |set| {
        registry
            .for_query(set, &lookup)
            .map(|index| index.def.name.clone())
    };
    assert_eq!(name(Some("s")).as_deref(), Some("on_s"));
    assert_eq!(name(Some("other")).as_deref(), Some("all"));
    assert_eq!(name(None).as_deref(), Some("all"));
    let list = Lookup {
        collection: CollectionType::List,
        ..lookup
    };
    assert_eq!(
        registry
            .for_query(None, &list)
            .map(|index| index.def.name.clone())
            .as_deref(),
        Some("list")
    );
    let string = Lookup {
        key_type: KeyType::String,
        ..lookup
    };
    assert!(registry.for_query(None, &string).is_none());
    let named = Lookup {
        name: Some("list"),
        ..lookup
    };
    assert_eq!(
        registry
            .for_query(None, &named)
            .map(|index| index.def.name.clone())
            .as_deref(),
        Some("list")
    );
}

#[test]
fn a_set_index_serves_scans_of_its_set_once_built_and_no_filter() {
    let registry = Registry::default();
    registry
        .create(def("namespace=t;set=s;indexname=set_s;indextype=SET"))
        .expect("created");
    let index = registry.get("set_s").expect("registered");
    // Not built yet: a scan must not read a partial index.
    assert!(registry.set_index("s").is_none());
    index.build_finished(1);
    assert_eq!(
        registry
            .set_index("s")
            .map(|index| index.def.name.clone())
            .as_deref(),
        Some("set_s")
    );
    assert!(registry.set_index("other").is_none());
    // Every record of the set contributes one entry, 0.
    struct Any;
    impl citrine_exp::Record for Any {
        fn bin(&self, _: &[u8]) -> Option<(u8, &[u8])> {
            None
        }
        fn key(&self) -> Option<(u8, &[u8])> {
            None
        }
        fn digest(&self) -> &[u8; 20] {
            &[0; 20]
        }
        fn set_name(&self) -> &[u8] {
            b"s"
        }
        fn last_update_ms(&self) -> u64 {
            0
        }
        fn void_time_s(&self) -> Option<u64> {
            None
        }
        fn record_size(&self) -> u64 {
            0
        }
        fn is_tombstone(&self) -> bool {
            false
        }
        fn exists(&self) -> bool {
            true
        }
        fn in_memory(&self) -> bool {
            true
        }
    }
    let mut keys = Vec::new();
    index.keys(&Any, 0, &mut keys);
    assert_eq!(keys, vec![Key::Int(0)]);
    // A filter on a bin never takes it, even one of its integer type.
    let lookup = Lookup {
        name: None,
        expression: None,
        bin: b"",
        key_type: KeyType::Numeric,
        collection: CollectionType::Default,
        context: None,
    };
    assert!(registry.for_query(Some("s"), &lookup).is_none());
}

#[test]
fn the_summary_lists_the_partitions_holding_a_range() {
    let index = Sindex::new(def("ns=t;indexname=i;bin=b;type=NUMERIC")).expect("index");
    let digests: Vec<Digest> = (0u8..40).map(|i| Digest([i; 20])).collect();
    for (i, digest) in digests.iter().enumerate() {
        index.update(digest, &[], &[Key::Int(i as i64 % 4)]);
    }
    let holders = |ranges: &[(i64, i64)]| {
        let map = index.partitions_in(ranges, usize::MAX).expect("few pairs");
        (0..4096).filter(|p| map[*p]).collect::<Vec<usize>>()
    };
    let expected = |value: i64| {
        let mut out: Vec<usize> = digests
            .iter()
            .enumerate()
            .filter(|(i, _)| *i as i64 % 4 == value)
            .map(|(_, digest)| digest.partition().index())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    };
    assert_eq!(holders(&[(2, 2)]), expected(2));
    assert!(holders(&[(7, 9)]).is_empty());
    // Moving a record's value moves its partition in the summary.
    let moved = digests[2];
    index.update(&moved, &[Key::Int(2)], &[Key::Int(9)]);
    assert_eq!(holders(&[(9, 9)]), vec![moved.partition().index()]);
    // Past the pair limit: no list (visit everything).
    assert!(index.partitions_in(&[(0, 3)], 3).is_none());
    // A dropped partition leaves the summary.
    index.clear_partition(moved.partition());
    assert!(holders(&[(9, 9)]).is_empty());
    index.update(&digests[6], &[Key::Int(2)], &[]);
    for partition in holders(&[(2, 2)]) {
        let mut out = Vec::new();
        index.candidates(
            citrine_types::PartitionId::new(partition as u16).expect("id"),
            &[(2, 2)],
            None,
            usize::MAX,
            &mut out,
        );
        assert!(
            !out.is_empty(),
            "partition {partition} is listed but holds nothing"
        );
    }
}
