//! Ranks among equal values, each case an answer of the reference server
//! (8.1.2): which of equal elements of an unordered list a rank (range,
//! relative range, context step) picks — its heap's choice — and in what
//! order it lists them; how it ranks an element chosen by index (by the
//! elements less than it); which of equal map values a path select's rank
//! step picks (its quickselect's choice).

use super::{int_result, ints, list, map, payload, run, LIST_APPEND};
use crate::result::quick_pick;
use crate::value::{self, Value};
use citrine_types::ParticleType;

const INDEX: i64 = 1;
const RANK: i64 = 3;
const REV_RANK: i64 = 4;
const VALUE: i64 = 7;
const INV: i64 = 0x10000;

const L_BY_INDEX: i64 = 19;
const L_BY_RANK: i64 = 21;
const L_BY_INDEX_RANGE: i64 = 24;
const L_BY_RANK_RANGE: i64 = 26;
const L_BY_VALUE_REL_RANK_RANGE: i64 = 27;
const L_REMOVE_BY_RANK: i64 = 34;
const L_REMOVE_BY_RANK_RANGE: i64 = 39;
const CTX_LIST_RANK: i64 = 0x11;

fn int(i: i64) -> Value {
    Value::Int(i)
}

/// The result of op `code` with `args` on `bin` (a modify op for removes).
fn answer(bin: &Value, code: i64, args: Vec<Value>) -> Value {
    let modify = (32..=63).contains(&code);
    let (_, result) = run(Some(bin), &payload(None, code, args), modify).expect("answers");
    let (particle, bytes) = result.expect("a result");
    if particle == ParticleType::Integer as u8 {
        return int(int_result(Some((particle, bytes))));
    }
    value::decode(&bytes).expect("a result value")
}

/// Seven nils and 1.5.
fn nils_then_a_double() -> Value {
    let mut items = vec![Value::Nil; 7];
    items.push(Value::Double(1.5));
    list(items)
}

#[test]
fn a_rank_picks_among_equal_elements_as_the_heap_does() {
    let l = nils_then_a_double();
    let picked: Vec<Value> = (0..8)
        .map(|rank| answer(&l, L_BY_RANK, vec![int(INDEX), int(rank)]))
        .collect();
    assert_eq!(picked, [0, 1, 6, 5, 5, 6, 3, 7].map(int));
    // RANK answers the rank asked for, whichever element it picked.
    assert_eq!(answer(&l, L_BY_RANK, vec![int(RANK), int(2)]), int(2));
    assert_eq!(answer(&l, L_BY_RANK, vec![int(REV_RANK), int(2)]), int(5));
}

#[test]
fn rank_ranges_pick_among_equal_elements_as_the_heap_does() {
    let l = ints(&[1, 0, 1, 0, 1, 0, 1]);
    let picked: Vec<Value> = (0..6)
        .map(|rank| answer(&l, L_BY_RANK_RANGE, vec![int(INDEX), int(rank), int(2)]))
        .collect();
    let want = [[1, 3], [3, 5], [4, 5], [2, 4], [4, 6], [0, 6]].map(|pair| ints(&pair));
    assert_eq!(picked, want);
    assert_eq!(
        answer(
            &l,
            L_BY_VALUE_REL_RANK_RANGE,
            vec![int(INDEX), int(1), int(-2), int(3)]
        ),
        ints(&[3, 4, 5])
    );
    // A remove takes what the get picks.
    assert_eq!(
        answer(&l, L_REMOVE_BY_RANK_RANGE, vec![int(INDEX), int(2), int(2)]),
        ints(&[4, 5])
    );
    assert_eq!(
        answer(
            &nils_then_a_double(),
            L_REMOVE_BY_RANK,
            vec![int(INDEX), int(2)]
        ),
        int(6)
    );
    // Values come in the order the heap took them.
    let l = ints(&[3, 1, 3, 7, 9]);
    let values = answer(&l, L_BY_RANK_RANGE, vec![int(VALUE), int(0), int(3)]);
    assert_eq!(values, ints(&[3, 3, 1]));
}

#[test]
fn an_element_chosen_by_index_ranks_by_the_elements_below_it() {
    let l = ints(&[1, 1, 2]);
    assert_eq!(answer(&l, L_BY_INDEX, vec![int(RANK), int(1)]), int(0));
    assert_eq!(answer(&l, L_BY_INDEX, vec![int(REV_RANK), int(1)]), int(2));
    let l = ints(&[2, 1, 1, 2, 1]);
    assert_eq!(
        answer(
            &l,
            L_BY_INDEX_RANGE,
            vec![int(REV_RANK | INV), int(1), int(2)]
        ),
        ints(&[1, 1, 4])
    );
}

#[test]
fn a_rank_context_step_picks_as_the_heap_does() {
    let nested = list(vec![ints(&[2]), ints(&[1]), ints(&[2])]);
    let ctx = vec![int(CTX_LIST_RANK), int(1)];
    let (bin, result) = run(
        Some(&nested),
        &payload(Some(ctx), LIST_APPEND, vec![int(9)]),
        true,
    )
    .expect("appends");
    assert_eq!(int_result(result), 2);
    let want = list(vec![ints(&[2]), ints(&[1]), ints(&[2, 9])]);
    assert_eq!(bin, Some(want));
}

#[test]
fn a_path_selects_rank_picks_as_the_quickselect_does() {
    // {0: 0, 3: 2, 6: 0, 12: 1, 13: 0, 15: 2, 19: 1, 25: 1}: the keys a
    // path select's map rank step 0..8 reaches.
    let entries = [
        (0, 0),
        (3, 2),
        (6, 0),
        (12, 1),
        (13, 0),
        (15, 2),
        (19, 1),
        (25, 1),
    ];
    let m = map(entries.iter().map(|&(k, v)| (int(k), int(v))).collect());
    let Value::Map(m) = m else { unreachable!() };
    let values: Vec<&Value> = m.entries.iter().map(|(_, v)| v).collect();
    let keys: Vec<i64> = (0..8)
        .map(|rank| entries[quick_pick(&values, rank)].0)
        .collect();
    assert_eq!(keys, [13, 0, 6, 25, 19, 12, 3, 15]);
}
