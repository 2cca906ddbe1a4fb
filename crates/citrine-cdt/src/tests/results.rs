//! The order and shape of index, rank and EXISTS results, each case an
//! answer of the reference server (8.1.2) read off the wire: inverted
//! selections answered by stretches, reverse numberings ascending within
//! a stretch, the whole collection as `0..n`, per-element orders, and
//! EXISTS of an inverted selection.

use super::{int_result, ints, list, map, payload, run};
use crate::value::{self, Map, Value, MAP_KEY_ORDERED, MAP_VALUE_ORDERED};

const INV: i64 = 0x10000;
const INDEX: i64 = 1;
const REV_INDEX: i64 = 2;
const RANK: i64 = 3;
const REV_RANK: i64 = 4;
const COUNT: i64 = 5;
const KEY: i64 = 6;
const VALUE: i64 = 7;
const EXISTS: i64 = 13;

// List codes.
const L_ALL_BY_VALUE: i64 = 22;
const L_BY_VALUE_LIST: i64 = 23;
const L_BY_INDEX_RANGE: i64 = 24;
const L_BY_VALUE_INTERVAL: i64 = 25;
const L_BY_RANK_RANGE: i64 = 26;
const L_BY_VALUE_REL_RANK_RANGE: i64 = 27;
const L_REMOVE_BY_RANK_RANGE: i64 = 39;
// Map codes.
const M_ALL_BY_VALUE: i64 = 102;
const M_BY_VALUE_INTERVAL: i64 = 105;
const M_BY_KEY_INTERVAL: i64 = 103;
const M_BY_INDEX_RANGE: i64 = 104;
const M_BY_RANK_RANGE: i64 = 106;
const M_BY_KEY_LIST: i64 = 107;
const M_BY_VALUE_LIST: i64 = 108;

fn s(text: &str) -> Value {
    Value::str(text)
}

fn int(i: i64) -> Value {
    Value::Int(i)
}

/// A map of string keys to ints, written in key order (as stored).
fn smap(flags: u8, pairs: &[(&str, i64)]) -> Value {
    let mut entries: Vec<(Value, Value)> = pairs.iter().map(|(k, v)| (s(k), int(*v))).collect();
    entries.sort_by(|(a, _), (b, _)| value::compare_total(a, b));
    if flags == 0 {
        return map(entries);
    }
    Value::Map(Map { flags, entries })
}

/// The result of op `code` with `args` on `bin` (a modify op when it
/// removes).
fn answer(bin: &Value, code: i64, args: Vec<Value>) -> Value {
    let modify = matches!(code, 32..=63 | 76..=95);
    let (_, result) = run(Some(bin), &payload(None, code, args), modify).expect("answers");
    let (particle, bytes) = result.expect("a result");
    if particle == citrine_types::ParticleType::Bool as u8 {
        return Value::Bool(bytes == [1]);
    }
    value::decode(&bytes).expect("a list result")
}

#[track_caller]
fn check(bin: &Value, code: i64, args: Vec<Value>, want: Value) {
    assert_eq!(answer(bin, code, args.clone()), want, "op {code} {args:?}");
}

#[test]
fn an_inverted_rank_range_answers_its_ranks_by_stretch() {
    // The official Python client's test_ctx_list_remove_by_rank_range:
    // ["how", "are", ["you"]], rank 2 count 2 inverted, RETURN_RANK.
    let words = list(vec![s("how"), s("are"), list(vec![s("you")])]);
    check(
        &words,
        L_REMOVE_BY_RANK_RANGE,
        vec![int(RANK | INV), int(2), int(2)],
        ints(&[0, 1]),
    );
    let l = ints(&[3, 1, 2, 5, 4]);
    // Ranks 2..4 left out: [0, 2) and [4, 5); reversed, each ascending.
    check(
        &l,
        L_BY_RANK_RANGE,
        vec![int(REV_RANK | INV), int(2), int(2)],
        ints(&[3, 4, 0]),
    );
    check(
        &l,
        L_BY_INDEX_RANGE,
        vec![int(REV_INDEX | INV), int(1), int(2)],
        ints(&[4, 0, 1]),
    );
}

#[test]
fn value_selections_of_a_list_answer_ranks_by_stretch() {
    let l = ints(&[3, 1, 2, 5, 4]);
    check(
        &l,
        L_BY_VALUE_INTERVAL,
        vec![int(RANK | INV), int(2), int(4)],
        ints(&[0, 3, 4]),
    );
    check(
        &l,
        L_ALL_BY_VALUE,
        vec![int(RANK | INV), int(2)],
        ints(&[0, 2, 3, 4]),
    );
    check(
        &l,
        L_ALL_BY_VALUE,
        vec![int(REV_RANK | INV), int(2)],
        ints(&[4, 0, 1, 2]),
    );
    // What a value list leaves out, by runs of ranks.
    check(
        &l,
        L_BY_VALUE_LIST,
        vec![int(REV_RANK | INV), ints(&[5, 1])],
        ints(&[1, 2, 3]),
    );
    // Indexes of a value selection stay element by element.
    check(
        &l,
        L_BY_VALUE_INTERVAL,
        vec![int(REV_INDEX | INV), int(2), int(4)],
        ints(&[3, 1, 0]),
    );
}

#[test]
fn an_empty_inverted_range_is_the_whole_list_or_keeps_its_split() {
    let l = ints(&[3, 1, 2, 5, 4, 2]);
    check(
        &l,
        L_BY_INDEX_RANGE,
        vec![int(REV_INDEX | INV), int(2), int(0)],
        ints(&[0, 1, 2, 3, 4, 5]),
    );
    // A rank range keeps its split at rank 2.
    check(
        &l,
        L_BY_RANK_RANGE,
        vec![int(REV_RANK | INV), int(2), int(0)],
        ints(&[4, 5, 0, 1, 2, 3]),
    );
    // So does a value interval that is one point; an empty wider one is
    // the whole list.
    let l = ints(&[1, 11, 4, 12, 9, 14, 13]);
    check(
        &l,
        L_BY_VALUE_INTERVAL,
        vec![int(REV_RANK | INV), int(4), int(4)],
        ints(&[6, 0, 1, 2, 3, 4, 5]),
    );
    check(
        &l,
        L_BY_VALUE_INTERVAL,
        vec![int(REV_RANK | INV), Value::Double(2.5), Value::Double(2.6)],
        ints(&[0, 1, 2, 3, 4, 5, 6]),
    );
}

#[test]
fn an_index_range_over_everything_answers_every_numbering_ascending() {
    let l = ints(&[13, 16, 2, 9]);
    for rt in [INDEX, REV_INDEX, RANK, REV_RANK] {
        check(
            &l,
            L_BY_INDEX_RANGE,
            vec![int(rt), int(0)],
            ints(&[0, 1, 2, 3]),
        );
    }
    let m = smap(0, &[("a", 3), ("b", 15), ("c", 20), ("d", 14)]);
    for rt in [INDEX, REV_INDEX, RANK, REV_RANK] {
        check(
            &m,
            M_BY_INDEX_RANGE,
            vec![int(rt), int(0)],
            ints(&[0, 1, 2, 3]),
        );
    }
    // A rank range over everything lists its indexes element by element.
    check(
        &m,
        M_BY_RANK_RANGE,
        vec![int(INDEX), int(0)],
        ints(&[0, 3, 1, 2]),
    );
}

#[test]
fn map_ranges_answer_reverse_numbers_ascending() {
    let m = smap(0, &[("a", 1), ("b", 3), ("c", 5), ("d", 2), ("e", 2)]);
    check(
        &m,
        M_BY_INDEX_RANGE,
        vec![int(REV_INDEX), int(1), int(2)],
        ints(&[2, 3]),
    );
    check(
        &m,
        M_BY_RANK_RANGE,
        vec![int(REV_RANK), int(1), int(3)],
        ints(&[1, 2, 3]),
    );
    check(
        &m,
        M_BY_INDEX_RANGE,
        vec![int(REV_INDEX | INV), int(1), int(2)],
        ints(&[4, 0, 1]),
    );
    // A key list's complement by runs of indexes: b, c | e.
    check(
        &m,
        M_BY_KEY_LIST,
        vec![int(REV_INDEX | INV), list(vec![s("d"), s("a")])],
        ints(&[2, 3, 0]),
    );
}

#[test]
fn map_key_intervals_split_unordered_and_list_ranks_by_index() {
    let keys = [("a", 1), ("b", 2), ("d", 3), ("e", 5)];
    let unordered = smap(0, &keys);
    check(
        &unordered,
        M_BY_KEY_INTERVAL,
        vec![int(REV_INDEX | INV), s("c"), s("c")],
        ints(&[2, 3, 0, 1]),
    );
    let ordered = smap(MAP_KEY_ORDERED, &keys);
    check(
        &ordered,
        M_BY_KEY_INTERVAL,
        vec![int(REV_INDEX | INV), s("c"), s("c")],
        ints(&[0, 1, 2, 3]),
    );
    // Ranks of a key selection come in index order.
    let m = Value::Map(Map {
        flags: 0,
        entries: vec![
            (int(0), int(17)),
            (int(4), int(2)),
            (int(5), int(15)),
            (int(9), int(10)),
        ],
    });
    check(
        &m,
        M_BY_KEY_INTERVAL,
        vec![int(RANK), int(4)],
        ints(&[0, 2, 1]),
    );
    check(
        &m,
        M_BY_KEY_INTERVAL,
        vec![int(REV_RANK), int(4)],
        ints(&[3, 1, 2]),
    );
}

#[test]
fn key_value_ordered_maps_list_value_selections_by_key() {
    let m = smap(
        MAP_KEY_ORDERED | MAP_VALUE_ORDERED,
        &[("a", 3), ("b", 1), ("c", 2)],
    );
    check(
        &m,
        M_BY_VALUE_INTERVAL,
        vec![int(KEY), int(1)],
        list(vec![s("a"), s("b"), s("c")]),
    );
    check(
        &m,
        M_BY_VALUE_LIST,
        vec![int(INDEX), ints(&[2, 1])],
        ints(&[1, 2]),
    );
}

#[test]
fn exists_of_an_inverted_selection_follows_the_references_paths() {
    let l = ints(&[10, 11, 12, 13, 14, 15]);
    let exists = |code: i64, start: i64, count: i64| {
        answer(&l, code, vec![int(EXISTS | INV), int(start), int(count)])
    };
    // An index range: whether anything is left.
    assert_eq!(exists(L_BY_INDEX_RANGE, 1, 2), Value::Bool(true));
    assert_eq!(exists(L_BY_INDEX_RANGE, 0, 6), Value::Bool(false));
    // A rank range of an unordered list: whether it chose nothing.
    assert_eq!(exists(L_BY_RANK_RANGE, 1, 2), Value::Bool(false));
    assert_eq!(exists(L_BY_RANK_RANGE, 0, 1), Value::Bool(false));
    assert_eq!(exists(L_BY_RANK_RANGE, 2, 0), Value::Bool(true));
    // A map range: whether what is left is one stretch.
    let m = smap(0, &[("a", 10), ("b", 11), ("c", 12)]);
    let exists = |code: i64, start: i64, count: i64| {
        answer(&m, code, vec![int(EXISTS | INV), int(start), int(count)])
    };
    assert_eq!(exists(M_BY_INDEX_RANGE, 1, 1), Value::Bool(false));
    assert_eq!(exists(M_BY_INDEX_RANGE, 0, 1), Value::Bool(true));
    assert_eq!(exists(M_BY_RANK_RANGE, 1, 2), Value::Bool(true));
    assert_eq!(exists(M_BY_RANK_RANGE, 0, 3), Value::Bool(false));
    assert_eq!(exists(M_BY_RANK_RANGE, 1, 0), Value::Bool(true));
}

#[test]
fn exists_of_inverted_value_matches_and_key_ranges_by_collection_kind() {
    let inverted_exists = |bin: &Value, code: i64, args: &[Value]| {
        let mut all = vec![int(EXISTS | INV)];
        all.extend_from_slice(args);
        answer(bin, code, all)
    };
    let yes = Value::Bool(true);
    let no = Value::Bool(false);
    // An unordered list's value match or interval: whether nothing
    // matched, an empty list included.
    let empty = ints(&[]);
    assert_eq!(inverted_exists(&empty, L_ALL_BY_VALUE, &[int(1)]), yes);
    assert_eq!(
        inverted_exists(&empty, L_BY_VALUE_INTERVAL, &[int(1), int(5)]),
        yes
    );
    let l = ints(&[1, 2]);
    assert_eq!(inverted_exists(&l, L_ALL_BY_VALUE, &[int(1)]), no);
    assert_eq!(inverted_exists(&l, L_ALL_BY_VALUE, &[int(3)]), yes);
    // A map's value match: whether nothing matched in a non-empty map,
    // key-ordered or not.
    let pairs = [("a", 10), ("b", 11), ("c", 12), ("d", 13)];
    let unordered = smap(0, &pairs);
    let key_ordered = smap(MAP_KEY_ORDERED, &pairs);
    assert_eq!(
        inverted_exists(&key_ordered, M_ALL_BY_VALUE, &[int(12)]),
        no
    );
    assert_eq!(inverted_exists(&unordered, M_ALL_BY_VALUE, &[int(10)]), no);
    assert_eq!(inverted_exists(&unordered, M_ALL_BY_VALUE, &[int(9)]), yes);
    // A key-ordered map's index range or key interval: whether anything is
    // left; an unordered map's key interval: whether nothing matched (an
    // empty map included), its index range: whether what is left is one
    // stretch.
    let middle = [int(1), int(1)];
    assert_eq!(
        inverted_exists(&key_ordered, M_BY_INDEX_RANGE, &middle),
        yes
    );
    assert_eq!(inverted_exists(&unordered, M_BY_INDEX_RANGE, &middle), no);
    let b_to_c = [s("b"), s("c")];
    assert_eq!(
        inverted_exists(&key_ordered, M_BY_KEY_INTERVAL, &b_to_c),
        yes
    );
    let a_to_b = [s("a"), s("b")];
    assert_eq!(inverted_exists(&unordered, M_BY_KEY_INTERVAL, &a_to_b), no);
    assert_eq!(
        inverted_exists(&smap(0, &[]), M_BY_KEY_INTERVAL, &a_to_b),
        yes
    );
}

#[test]
fn an_unordered_lists_inverted_value_selection_keeps_its_split_when_empty() {
    // Nothing matched: reverse ranks of the stretch below where the value
    // would sort, then of the one above.
    let l = ints(&[1, 11, 4, 12, 9, 14, 13]);
    let split = ints(&[4, 5, 6, 0, 1, 2, 3]);
    check(
        &l,
        L_ALL_BY_VALUE,
        vec![int(REV_RANK | INV), int(10)],
        split.clone(),
    );
    check(
        &l,
        L_BY_VALUE_REL_RANK_RANGE,
        vec![int(REV_RANK | INV), int(10), int(0), int(0)],
        split,
    );
    let l = list(vec![
        s("a"),
        int(3),
        Value::Double(1.5),
        Value::Nil,
        Value::Double(1.5),
    ]);
    check(
        &l,
        L_BY_VALUE_INTERVAL,
        vec![int(REV_RANK | INV), s("b"), Value::Double(1.5)],
        ints(&[2, 3, 4, 0, 1]),
    );
}

#[test]
fn an_ordered_lists_value_list_answers_each_values_matches_as_a_stretch() {
    let ordered = Value::List(crate::value::List {
        flags: crate::value::LIST_ORDERED,
        items: [2, 3, 4, 4, 4, 5].iter().map(|&i| int(i)).collect(),
    });
    let values = ints(&[4, 2]);
    check(
        &ordered,
        L_BY_VALUE_LIST,
        vec![int(INDEX), values.clone()],
        ints(&[2, 3, 4, 0]),
    );
    for rt in [REV_INDEX, REV_RANK] {
        check(
            &ordered,
            L_BY_VALUE_LIST,
            vec![int(rt), values.clone()],
            ints(&[1, 2, 3, 5]),
        );
    }
    // An unordered list lists a value's reverse ranks descending.
    let unordered = ints(&[4, 4, 3, 5, 2, 4]);
    check(
        &unordered,
        L_BY_VALUE_LIST,
        vec![int(REV_RANK), values],
        ints(&[3, 2, 1, 5]),
    );
}

#[test]
fn a_value_or_key_listed_again_by_collection_kind() {
    let ordered = Value::List(crate::value::List {
        flags: crate::value::LIST_ORDERED,
        items: [2, 2, 3].iter().map(|&i| int(i)).collect(),
    });
    let listed = ints(&[3, 2, 3, 2]);
    // An ordered list answers a value's matches each time it is listed
    // (but counts them once).
    check(
        &ordered,
        L_BY_VALUE_LIST,
        vec![int(RANK), listed.clone()],
        ints(&[2, 0, 1, 2, 0, 1]),
    );
    check(
        &ordered,
        L_BY_VALUE_LIST,
        vec![int(VALUE), listed.clone()],
        ints(&[3, 2, 2, 3, 2, 2]),
    );
    let count = payload(None, L_BY_VALUE_LIST, vec![int(COUNT), listed.clone()]);
    let (_, counted) = run(Some(&ordered), &count, false).expect("counts");
    assert_eq!(int_result(counted), 3);
    // An unordered list answers ranks in the order of each value's last
    // listing.
    let unordered = ints(&[2, 2, 3]);
    check(
        &unordered,
        L_BY_VALUE_LIST,
        vec![int(RANK), listed],
        ints(&[2, 0, 1]),
    );
    // Maps: an unordered one answers indexes in the order of each key's
    // last listing, a key-ordered one each listing; ranks of a value list
    // by last listing, but a map of one entry answers each listing.
    let pairs = [("a", 5), ("b", 6)];
    let keys = list(vec![s("b"), s("b"), s("a")]);
    check(
        &smap(0, &pairs),
        M_BY_KEY_LIST,
        vec![int(INDEX), keys.clone()],
        ints(&[1, 0]),
    );
    check(
        &smap(MAP_KEY_ORDERED, &pairs),
        M_BY_KEY_LIST,
        vec![int(INDEX), keys],
        ints(&[1, 1, 0]),
    );
    check(
        &smap(MAP_KEY_ORDERED, &pairs),
        M_BY_VALUE_LIST,
        vec![int(RANK), ints(&[5, 6, 5])],
        ints(&[1, 0]),
    );
    check(
        &smap(0, &[("a", 5)]),
        M_BY_VALUE_LIST,
        vec![int(RANK), ints(&[5, 5])],
        ints(&[0, 0]),
    );
}
