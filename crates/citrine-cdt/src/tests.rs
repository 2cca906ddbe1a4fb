//! Tests of `operate` end to end: payload bytes in, the bin and the result
//! particle out, with contexts, creation, wrong types and malformed input.

use crate::value::{self, List, Map, Value};
use crate::{operate, CdtError};
use citrine_types::ParticleType;

const LIST: u8 = ParticleType::List as u8;
const MAP: u8 = ParticleType::Map as u8;

fn list(items: Vec<Value>) -> Value {
    Value::List(List { flags: 0, items })
}

fn map(entries: Vec<(Value, Value)>) -> Value {
    Value::Map(Map { flags: 0, entries })
}

fn ints(items: &[i64]) -> Value {
    list(items.iter().map(|&i| Value::Int(i)).collect())
}

/// Encodes an op: `[code, args...]`, or with a context `[0xff, ctx, op]`.
fn payload(ctx: Option<Vec<Value>>, code: i64, args: Vec<Value>) -> Vec<u8> {
    let mut op = vec![Value::Int(code)];
    op.extend(args);
    let request = match ctx {
        None => list(op),
        Some(ctx) => list(vec![Value::Int(0xff), list(ctx), list(op)]),
    };
    value::to_bytes(&request)
}

/// A result particle: type and bytes.
type Particle = (u8, Vec<u8>);

fn run(
    bin: Option<&Value>,
    payload: &[u8],
    modify: bool,
) -> Result<(Option<Value>, Option<Particle>), CdtError> {
    let encoded = bin.map(|v| {
        let particle = if matches!(v, Value::Map(_)) {
            MAP
        } else {
            LIST
        };
        (particle, value::to_bytes(v))
    });
    let outcome = operate(
        payload,
        encoded.as_ref().map(|(p, b)| (*p, b.as_slice())),
        modify,
    )?;
    let new_bin = outcome
        .bin
        .map(|(_, bytes)| value::decode(&bytes).expect("the new bin decodes"));
    Ok((new_bin, outcome.result))
}

fn int_result(result: Option<Particle>) -> i64 {
    let (particle, bytes) = result.expect("a result");
    assert_eq!(particle, ParticleType::Integer as u8);
    i64::from_be_bytes(bytes.try_into().expect("8 bytes"))
}

// List op codes used here (05 §2.3) and map op codes (§2.4).
const LIST_APPEND: i64 = 1;
const LIST_SET: i64 = 9;
const LIST_REMOVE_BY_VALUE: i64 = 33;
const RETURN_NONE: i64 = 0;
const LIST_SIZE: i64 = 16;
const MAP_PUT: i64 = 67;
const MAP_SIZE: i64 = 96;
const MAP_GET_BY_KEY: i64 = 97;
const RETURN_VALUE: i64 = 7;
const CTX_LIST_INDEX: i64 = 0x10;
const CTX_MAP_KEY: i64 = 0x22;
const CREATE_KEY_ORDERED_MAP: i64 = 0x80;

#[test]
fn append_creates_a_list_and_answers_its_size() {
    let (bin, result) =
        run(None, &payload(None, LIST_APPEND, vec![Value::Int(5)]), true).expect("appends");
    assert_eq!(int_result(result), 1);
    assert_eq!(
        value::to_bytes(&bin.expect("a new bin")),
        value::to_bytes(&ints(&[5]))
    );
}

#[test]
fn a_read_changes_nothing_and_a_read_of_a_missing_bin_answers_nothing() {
    let current = ints(&[1, 2, 3]);
    let (bin, result) =
        run(Some(&current), &payload(None, LIST_SIZE, vec![]), false).expect("reads");
    assert!(bin.is_none());
    assert_eq!(int_result(result), 3);
    let (bin, result) = run(None, &payload(None, LIST_SIZE, vec![]), false).expect("reads");
    assert!(bin.is_none() && result.is_none());
}

#[test]
fn a_modify_code_under_cdt_read_is_refused() {
    let current = ints(&[1]);
    assert_eq!(
        run(
            Some(&current),
            &payload(None, LIST_APPEND, vec![Value::Int(2)]),
            false
        )
        .err(),
        Some(CdtError::Parameter)
    );
}

#[test]
fn list_ops_on_a_map_and_map_ops_on_a_list_are_incompatible() {
    let m = map(vec![(Value::str("a"), Value::Int(1))]);
    assert_eq!(
        run(Some(&m), &payload(None, LIST_SIZE, vec![]), false).err(),
        Some(CdtError::IncompatibleType)
    );
    let l = ints(&[1]);
    assert_eq!(
        run(Some(&l), &payload(None, MAP_SIZE, vec![]), false).err(),
        Some(CdtError::IncompatibleType)
    );
    // A scalar bin is no collection at all.
    let outcome = operate(
        &payload(None, LIST_SIZE, vec![]),
        Some((ParticleType::Integer as u8, &[0; 8])),
        false,
    );
    assert_eq!(outcome.err(), Some(CdtError::IncompatibleType));
}

#[test]
fn a_context_walks_into_nested_collections() {
    // {"a": [[1], [2, 3]]}: append 4 to the last inner list.
    let current = map(vec![(
        Value::str("a"),
        list(vec![ints(&[1]), ints(&[2, 3])]),
    )]);
    let ctx = vec![
        Value::Int(CTX_MAP_KEY),
        Value::str("a"),
        Value::Int(CTX_LIST_INDEX),
        Value::Int(-1),
    ];
    let (bin, result) = run(
        Some(&current),
        &payload(Some(ctx), LIST_APPEND, vec![Value::Int(4)]),
        true,
    )
    .expect("appends");
    assert_eq!(int_result(result), 3);
    let expected = map(vec![(
        Value::str("a"),
        list(vec![ints(&[1]), ints(&[2, 3, 4])]),
    )]);
    assert_eq!(
        value::to_bytes(&bin.expect("changed")),
        value::to_bytes(&expected)
    );
}

#[test]
fn a_create_context_adds_the_key_and_the_op_makes_what_goes_there() {
    // The step's flags order the map it looks in (here it exists, so they
    // change nothing); the map at the new key is the put's own.
    let current = map(vec![]);
    let ctx = vec![
        Value::Int(CTX_MAP_KEY | CREATE_KEY_ORDERED_MAP),
        Value::str("new"),
    ];
    let (bin, result) = run(
        Some(&current),
        &payload(
            Some(ctx.clone()),
            MAP_PUT,
            vec![Value::str("k"), Value::Int(7)],
        ),
        true,
    )
    .expect("puts");
    assert_eq!(int_result(result), 1);
    let Some(Value::Map(outer)) = bin else {
        panic!("a map")
    };
    assert!(!outer.is_key_ordered());
    let (key, Value::Map(inner)) = &outer.entries[0] else {
        panic!("a nested map")
    };
    assert_eq!(key, &Value::str("new"));
    assert!(!inner.is_key_ordered());
    assert_eq!(inner.entries, vec![(Value::str("k"), Value::Int(7))]);

    // A list op under the same context makes a list at the key (the
    // official Node client's `addMapKeyCreate` + `lists.set` case).
    let (bin, _) = run(
        Some(&current),
        &payload(
            Some(ctx.clone()),
            LIST_SET,
            vec![Value::Int(0), Value::Int(150)],
        ),
        true,
    )
    .expect("sets");
    assert_eq!(bin, Some(map(vec![(Value::str("new"), ints(&[150]))])));

    // With the bin missing, the step's flags order the map created for it.
    let (bin, _) = run(
        None,
        &payload(Some(ctx), MAP_PUT, vec![Value::str("k"), Value::Int(7)]),
        true,
    )
    .expect("puts");
    let Some(Value::Map(outer)) = bin else {
        panic!("a map")
    };
    assert!(outer.is_key_ordered());
    assert!(matches!(&outer.entries[0].1, Value::Map(inner) if !inner.is_key_ordered()));
}

#[test]
fn below_a_create_every_missing_level_is_made_of_the_next_steps_kind() {
    // [map key "a" (create), list index 0, map key "b"] on a missing bin:
    // the bin a map, at "a" a list (the second step's kind), in it a map
    // (the third's), at "b" what the op makes.
    let ctx = vec![
        Value::Int(CTX_MAP_KEY | 0x40),
        Value::str("a"),
        Value::Int(CTX_LIST_INDEX),
        Value::Int(0),
        Value::Int(CTX_MAP_KEY),
        Value::str("b"),
    ];
    let (bin, _) = run(
        None,
        &payload(Some(ctx), LIST_APPEND, vec![Value::Int(1)]),
        true,
    )
    .expect("appends");
    assert_eq!(
        bin,
        Some(map(vec![(
            Value::str("a"),
            list(vec![map(vec![(Value::str("b"), ints(&[1]))])])
        )]))
    );
}

#[test]
fn a_created_element_the_op_leaves_absent_is_taken_back() {
    // A remove-by-value on the element being created changes nothing and
    // leaves no key behind.
    let current = map(vec![(Value::str("x"), Value::Int(1))]);
    let ctx = vec![Value::Int(CTX_MAP_KEY | 0x40), Value::str("new")];
    let (bin, _) = run(
        Some(&current),
        &payload(
            Some(ctx),
            LIST_REMOVE_BY_VALUE,
            vec![Value::Int(RETURN_NONE), Value::Int(3)],
        ),
        true,
    )
    .expect("removes nothing");
    assert_eq!(bin, Some(current));
}

#[test]
fn results_come_back_as_particles() {
    let current = map(vec![
        (Value::str("s"), Value::str("text")),
        (Value::str("l"), ints(&[1, 2])),
    ]);
    let get = |key: &str| {
        run(
            Some(&current),
            &payload(
                None,
                MAP_GET_BY_KEY,
                vec![Value::Int(RETURN_VALUE), Value::str(key)],
            ),
            false,
        )
        .expect("reads")
        .1
        .expect("a result")
    };
    assert_eq!(get("s"), (ParticleType::String as u8, b"text".to_vec()));
    assert_eq!(get("l"), (LIST, value::to_bytes(&ints(&[1, 2]))));
}

#[test]
fn the_pre_3_x_form_a_16_bit_code_then_an_argument_array_is_read_as_the_array_form() {
    let current = ints(&[1, 2, 3]);
    // LIST_SIZE with no arguments: the two code bytes alone.
    let (bin, result) = run(Some(&current), &[0, LIST_SIZE as u8], false).expect("reads");
    assert!(bin.is_none());
    assert_eq!(int_result(result), 3);
    // LIST_APPEND 7: the code, then the arguments as one msgpack array.
    let mut legacy = vec![0, LIST_APPEND as u8];
    legacy.extend(value::to_bytes(&list(vec![Value::Int(7)])));
    let (bin, result) = run(Some(&current), &legacy, true).expect("appends");
    assert_eq!(int_result(result), 4);
    assert_eq!(
        value::to_bytes(&bin.expect("the new bin")),
        value::to_bytes(&ints(&[1, 2, 3, 7]))
    );
    // Arguments that are not an array, a lone zero byte, trailing bytes.
    let bin = value::to_bytes(&current);
    for case in [
        vec![0],
        vec![0, LIST_APPEND as u8, 0x07],
        vec![0, LIST_APPEND as u8, 0x91, 0x07, 0x07],
        vec![0, LIST_APPEND as u8, 0x92, 0x07],
    ] {
        assert_eq!(
            operate(&case, Some((LIST, &bin)), true).err(),
            Some(CdtError::Parameter),
            "{case:x?}"
        );
    }
}

#[test]
fn malformed_payloads_are_parameter_errors_never_panics() {
    let current = ints(&[1, 2, 3]);
    let bin = value::to_bytes(&current);
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xc1],
        vec![0x01],
        vec![0x90],
        vec![0x91, 0xa1, 0x03],
        vec![0x93, 0xcc, 0xff, 0x90, 0x91, 0x10],
        vec![0x93, 0xcc, 0xff, 0x92, 0x10, 0xa1, 0x03, 0x91, 0x10],
        vec![0x91, 0xcc, 0x80],
        vec![0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff],
    ];
    for case in cases {
        let outcome = operate(&case, Some((LIST, &bin)), true);
        assert!(outcome.is_err(), "{case:x?}");
    }
    // Every prefix of a valid op, under both op types, fails cleanly.
    let valid = payload(
        Some(vec![Value::Int(CTX_LIST_INDEX), Value::Int(0)]),
        LIST_APPEND,
        vec![Value::str("x")],
    );
    for end in 0..valid.len() {
        for modify in [false, true] {
            let _ = operate(&valid[..end], Some((LIST, &bin)), modify);
        }
    }
}

#[test]
fn a_corrupt_stored_bin_is_an_error_not_a_panic() {
    assert!(operate(
        &payload(None, LIST_SIZE, vec![]),
        Some((LIST, &[0x93, 0x01])),
        false
    )
    .is_err());
}

#[test]
fn a_list_created_at_the_end_of_an_ordered_list_is_sorted_into_place() {
    // Ordered [[1, 2, 3], [5, 7, 9]]; create an ordered list at index 2
    // (its end) and append 2 there: the parent re-sorts to put [2] second.
    let current = Value::List(List {
        flags: value::LIST_ORDERED,
        items: vec![ints(&[1, 2, 3]), ints(&[5, 7, 9])],
    });
    let ctx = vec![Value::Int(CTX_LIST_INDEX | 0xc0), Value::Int(2)];
    let (bin, result) = run(
        Some(&current),
        &payload(Some(ctx.clone()), LIST_APPEND, vec![Value::Int(2)]),
        true,
    )
    .expect("appends");
    assert_eq!(int_result(result), 1);
    let Some(Value::List(top)) = bin else {
        panic!("a list")
    };
    assert_eq!(
        top.items,
        vec![ints(&[1, 2, 3]), ints(&[2]), ints(&[5, 7, 9])]
    );
    // Past the end, an ordered list appends whatever the index.
    let past = vec![Value::Int(CTX_LIST_INDEX | 0xc0), Value::Int(5)];
    let (bin, _) = run(
        Some(&current),
        &payload(Some(past), LIST_APPEND, vec![Value::Int(2)]),
        true,
    )
    .expect("appends");
    assert_eq!(bin.as_ref(), Some(&Value::List(top)));
}

#[test]
fn a_list_index_create_pads_only_when_unbounded() {
    // The official Node client's `addListIndexCreate(index, order, pad)`
    // cases on [[1, 2], [5, 6], [3, 4], [5, 6]] with `lists.set(0, 150)`:
    // at index 4 (the end) every flag works and the op makes [150]; at 5
    // only the unbounded flag (0x80: unordered with padding) does, padding
    // with a nil; the others answer 26.
    let current = list(vec![
        ints(&[1, 2]),
        ints(&[5, 6]),
        ints(&[3, 4]),
        ints(&[5, 6]),
    ]);
    let set = |flags: i64, index: i64| {
        let ctx = vec![Value::Int(CTX_LIST_INDEX | flags), Value::Int(index)];
        run(
            Some(&current),
            &payload(Some(ctx), LIST_SET, vec![Value::Int(0), Value::Int(150)]),
            true,
        )
        .map(|(bin, _)| bin)
    };
    for flags in [0x40, 0x80, 0xc0] {
        let Ok(Some(Value::List(top))) = set(flags, 4) else {
            panic!("index 4 with flags {flags:#x}")
        };
        assert_eq!(top.items.len(), 5);
        assert_eq!(top.items[4], ints(&[150]));
    }
    let Ok(Some(Value::List(top))) = set(0x80, 5) else {
        panic!("index 5 unbounded")
    };
    assert_eq!(&top.items[4..], &[Value::Nil, ints(&[150])]);
    for flags in [0x40, 0xc0] {
        assert_eq!(
            set(flags, 5).err(),
            Some(CdtError::OpNotApplicable),
            "{flags:#x}"
        );
    }
}

// Inputs from the review of the first version: each crashed the process,
// broke an invariant or answered what clients cannot read.

#[test]
fn a_create_context_pads_no_further_than_a_list_insert() {
    let current = ints(&[1]);
    for index in [1i64 << 40, i64::MAX - 1, 50_000_000] {
        let ctx = vec![Value::Int(CTX_LIST_INDEX | 0x80), Value::Int(index)];
        assert_eq!(
            run(
                Some(&current),
                &payload(Some(ctx), LIST_APPEND, vec![Value::Int(5)]),
                true
            )
            .err(),
            Some(CdtError::OpNotApplicable),
            "{index}"
        );
    }
}

#[test]
fn contexts_deeper_than_a_stored_value_are_refused() {
    // Create steps nest one list each: thousands of them overflowed the
    // stack; 70 wrote a bin the decoder then refused forever.
    for steps in [70usize, 10_000] {
        let ctx: Vec<Value> = (0..steps)
            .flat_map(|_| [Value::Int(CTX_LIST_INDEX | 0x40), Value::Int(0)])
            .collect();
        assert_eq!(
            run(
                None,
                &payload(Some(ctx), LIST_APPEND, vec![Value::Int(5)]),
                true
            )
            .err(),
            Some(CdtError::Parameter),
            "{steps} steps"
        );
    }
    // An argument that would make the bin too deep is refused too.
    let mut deep = Value::Int(0);
    for _ in 0..value::MAX_DEPTH {
        deep = list(vec![deep]);
    }
    assert_eq!(
        run(
            Some(&ints(&[])),
            &payload(None, LIST_APPEND, vec![deep]),
            true
        )
        .err(),
        Some(CdtError::Parameter)
    );
}

#[test]
fn helper_exts_in_a_stored_bin_are_plain_values() {
    // A client may store the wildcard's bytes in a list; sorting such a
    // list with "equals anything" panicked (not a total order).
    let mut bytes = vec![0xdc, 0x00, 40];
    for i in 0..40u8 {
        if i % 3 == 0 {
            bytes.extend_from_slice(&[0xd4, 0xff, 0x00]);
        } else {
            bytes.push(i % 7);
        }
    }
    const SORT: i64 = 13;
    let outcome = operate(
        &payload(None, SORT, vec![Value::Int(0)]),
        Some((LIST, &bytes)),
        true,
    )
    .expect("sorts");
    let (_, sorted) = outcome.bin.expect("sorted");
    let Value::List(sorted) = value::decode_stored(&sorted).expect("decodes") else {
        panic!("a list")
    };
    assert_eq!(sorted.items.len(), 40);
    assert!(sorted.items[..26]
        .iter()
        .all(|item| matches!(item, Value::Int(_))));
    assert!(sorted.items[26..]
        .iter()
        .all(|item| matches!(item, Value::Ext(0xff, _))));
}

#[test]
fn a_create_context_refuses_a_key_a_map_cannot_hold() {
    let current = map(vec![]);
    for key in [ints(&[1, 2]), Value::Wildcard, Value::Infinity] {
        let ctx = vec![Value::Int(CTX_MAP_KEY | 0x40), key];
        assert_eq!(
            run(
                Some(&current),
                &payload(Some(ctx), MAP_PUT, vec![Value::Int(1), Value::Int(1)]),
                true
            )
            .err(),
            Some(CdtError::Parameter)
        );
    }
}

#[test]
fn nested_ordered_collections_from_arguments_are_stored_in_order() {
    // Append a key-ordered map whose keys arrive unsorted and repeated.
    let unsorted = Value::Map(Map {
        flags: value::MAP_KEY_ORDERED,
        entries: vec![
            (Value::str("b"), Value::Int(1)),
            (Value::str("a"), Value::Int(2)),
            (Value::str("b"), Value::Int(3)),
        ],
    });
    let (bin, _) = run(
        Some(&ints(&[])),
        &payload(None, LIST_APPEND, vec![unsorted]),
        true,
    )
    .expect("appends");
    let expected = list(vec![Value::Map(Map {
        flags: value::MAP_KEY_ORDERED,
        entries: vec![
            (Value::str("a"), Value::Int(2)),
            (Value::str("b"), Value::Int(3)),
        ],
    })]);
    assert_eq!(
        value::to_bytes(&bin.expect("changed")),
        value::to_bytes(&expected)
    );
}

#[test]
fn a_geojson_result_carries_the_particle_header() {
    let current = map(vec![(Value::str("g"), Value::Geo(b"{}".to_vec()))]);
    let (_, result) = run(
        Some(&current),
        &payload(
            None,
            MAP_GET_BY_KEY,
            vec![Value::Int(RETURN_VALUE), Value::str("g")],
        ),
        false,
    )
    .expect("reads");
    assert_eq!(
        result,
        Some((ParticleType::GeoJson as u8, vec![0, 0, 0, b'{', b'}']))
    );
}

#[test]
fn a_create_context_for_an_op_that_does_nothing_leaves_no_bin() {
    // The official C client's "Nested List ctx": a clear under a create
    // context on a missing bin creates nothing (the record is not made);
    // a set-type there does make the bin.
    const LIST_CLEAR: i64 = 11;
    const LIST_SET_TYPE: i64 = 0;
    const CREATE_ORDERED_LIST: i64 = 0xc0;
    let ctx = vec![
        Value::Int(CTX_LIST_INDEX | CREATE_ORDERED_LIST),
        Value::Int(3),
    ];
    let (bin, _) = run(None, &payload(Some(ctx.clone()), LIST_CLEAR, vec![]), true)
        .expect("a clear of nothing");
    assert!(bin.is_none(), "{bin:?}");
    let (bin, _) = run(
        None,
        &payload(Some(ctx), LIST_SET_TYPE, vec![Value::Int(0)]),
        true,
    )
    .expect("set-type");
    let Some(Value::List(outer)) = bin else {
        panic!("a list bin")
    };
    assert_eq!(outer.items.len(), 1);
}

mod paths;
mod results;
mod ties;
