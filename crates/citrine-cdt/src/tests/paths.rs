//! Contexts that cannot be followed, as the reference server (8.1.2)
//! answers them: a step whose element is missing, a step of an unknown
//! kind or with a value of the wrong type, a step taken in a scalar or in
//! the other collection kind, a write's step on a missing bin — all 26
//! (`OpNotApplicable`), reads and writes alike; a context on a bin that is
//! no collection is 4; the op on a scalar where a path ends stays 12.

use super::{int_result, ints, list, map, payload, run, LIST_APPEND, LIST_SIZE, MAP_PUT, MAP_SIZE};
use super::{CTX_LIST_INDEX, CTX_MAP_KEY};
use crate::value::Value;
use crate::{operate, CdtError};
use citrine_types::ParticleType;

const CTX_LIST_RANK: i64 = 0x11;
const CTX_LIST_VALUE: i64 = 0x13;
const CTX_MAP_INDEX: i64 = 0x20;
const CTX_MAP_RANK: i64 = 0x21;
const CTX_MAP_VALUE: i64 = 0x23;
const CREATE: i64 = 0x40;
const PERSIST: i64 = 0x100;

fn s(text: &str) -> Value {
    Value::str(text)
}

/// `[["hi", "friend", ["how", "are", ["you"]]], ["hey", ["numbers", [1, 2, 3]], "home boy"], 7]`
/// (the official Python client's nested list, and a scalar at the end).
fn nested_list() -> Value {
    list(vec![
        list(vec![
            s("hi"),
            s("friend"),
            list(vec![s("how"), s("are"), list(vec![s("you")])]),
        ]),
        list(vec![
            s("hey"),
            list(vec![s("numbers"), ints(&[1, 2, 3])]),
            s("home boy"),
        ]),
        Value::Int(7),
    ])
}

/// `{"first": {"greet": "hi", "numbers": [3, 1, 2]}, "second": {"nested": {"a": 4}}, "s": 5}`
fn nested_map() -> Value {
    map(vec![
        (
            s("first"),
            map(vec![
                (s("greet"), s("hi")),
                (s("numbers"), ints(&[3, 1, 2])),
            ]),
        ),
        (
            s("second"),
            map(vec![(s("nested"), map(vec![(s("a"), Value::Int(4))]))]),
        ),
        (s("s"), Value::Int(5)),
    ])
}

fn ctx(steps: &[(i64, Value)]) -> Vec<Value> {
    steps
        .iter()
        .flat_map(|(kind, value)| [Value::Int(*kind), value.clone()])
        .collect()
}

/// The error of a list and a map read and write under `steps` on `bin`
/// (all four must agree), or `None` when they succeed.
fn answers(bin: Option<&Value>, steps: &[(i64, Value)]) -> Vec<Option<CdtError>> {
    let c = || Some(ctx(steps));
    [
        (payload(c(), LIST_SIZE, vec![]), false),
        (payload(c(), MAP_SIZE, vec![]), false),
        (payload(c(), LIST_APPEND, vec![Value::Int(9)]), true),
        (payload(c(), MAP_PUT, vec![s("k"), Value::Int(9)]), true),
    ]
    .iter()
    .map(|(request, modify)| run(bin, request, *modify).err())
    .collect()
}

fn all(error: CdtError) -> Vec<Option<CdtError>> {
    vec![Some(error); 4]
}

#[test]
fn a_step_whose_element_is_missing_answers_26_to_reads_and_writes() {
    let l = nested_list();
    let m = nested_map();
    let cases: Vec<(&Value, Vec<(i64, Value)>)> = vec![
        (&l, vec![(CTX_LIST_INDEX, Value::Int(3))]),
        (&l, vec![(CTX_LIST_INDEX, Value::Int(10))]),
        (&l, vec![(CTX_LIST_INDEX, Value::Int(-10))]),
        (&l, vec![(CTX_LIST_RANK, Value::Int(10))]),
        (&l, vec![(CTX_LIST_RANK, Value::Int(-10))]),
        (&l, vec![(CTX_LIST_VALUE, Value::Int(99))]),
        (&m, vec![(CTX_MAP_KEY, s("zz"))]),
        (&m, vec![(CTX_MAP_INDEX, Value::Int(10))]),
        (&m, vec![(CTX_MAP_INDEX, Value::Int(-10))]),
        (&m, vec![(CTX_MAP_RANK, Value::Int(10))]),
        (&m, vec![(CTX_MAP_VALUE, Value::Int(99))]),
        // Several levels down.
        (
            &l,
            vec![
                (CTX_LIST_INDEX, Value::Int(0)),
                (CTX_LIST_INDEX, Value::Int(2)),
                (CTX_LIST_INDEX, Value::Int(9)),
            ],
        ),
        (
            &m,
            vec![
                (CTX_MAP_KEY, s("second")),
                (CTX_MAP_KEY, s("nested")),
                (CTX_MAP_KEY, s("zz")),
            ],
        ),
        (
            &m,
            vec![
                (CTX_MAP_KEY, s("first")),
                (CTX_MAP_KEY, s("numbers")),
                (CTX_LIST_INDEX, Value::Int(7)),
            ],
        ),
    ];
    for (bin, steps) in cases {
        assert_eq!(
            answers(Some(bin), &steps),
            all(CdtError::OpNotApplicable),
            "{steps:?}"
        );
    }
}

#[test]
fn a_step_in_a_scalar_or_in_the_other_collection_kind_answers_26() {
    let l = nested_list();
    let m = nested_map();
    let cases: Vec<(&Value, Vec<(i64, Value)>)> = vec![
        // l[2] is 7: a step inside it.
        (
            &l,
            vec![
                (CTX_LIST_INDEX, Value::Int(2)),
                (CTX_LIST_INDEX, Value::Int(0)),
            ],
        ),
        // A string four levels down.
        (
            &l,
            vec![
                (CTX_LIST_INDEX, Value::Int(0)),
                (CTX_LIST_INDEX, Value::Int(2)),
                (CTX_LIST_INDEX, Value::Int(2)),
                (CTX_LIST_INDEX, Value::Int(0)),
                (CTX_LIST_INDEX, Value::Int(0)),
            ],
        ),
        (&l, vec![(CTX_MAP_KEY, s("a"))]),
        (&l, vec![(CTX_MAP_INDEX, Value::Int(0))]),
        (&m, vec![(CTX_LIST_INDEX, Value::Int(0))]),
        (&m, vec![(CTX_MAP_KEY, s("s")), (CTX_MAP_KEY, s("x"))]),
        // A create flag does not make a scalar a collection.
        (
            &m,
            vec![(CTX_MAP_KEY, s("s")), (CTX_MAP_KEY | CREATE, s("x"))],
        ),
        (&l, vec![(CTX_MAP_KEY | CREATE, s("k"))]),
    ];
    for (bin, steps) in cases {
        assert_eq!(
            answers(Some(bin), &steps),
            all(CdtError::OpNotApplicable),
            "{steps:?}"
        );
    }
    // A nil element is a scalar too.
    let with_nil = list(vec![Value::Nil, ints(&[1])]);
    assert_eq!(
        answers(
            Some(&with_nil),
            &[
                (CTX_LIST_INDEX, Value::Int(0)),
                (CTX_LIST_INDEX, Value::Int(0))
            ]
        ),
        all(CdtError::OpNotApplicable)
    );
}

#[test]
fn the_op_on_a_scalar_where_a_path_ends_stays_incompatible() {
    let l = nested_list();
    assert_eq!(
        answers(Some(&l), &[(CTX_LIST_INDEX, Value::Int(2))]),
        all(CdtError::IncompatibleType)
    );
    let m = nested_map();
    assert_eq!(
        answers(Some(&m), &[(CTX_MAP_KEY | CREATE, s("s"))]),
        all(CdtError::IncompatibleType)
    );
}

#[test]
fn a_step_of_an_unknown_kind_or_a_wrong_value_type_answers_26() {
    let l = list(vec![ints(&[1]), ints(&[2])]);
    let cases: Vec<Vec<(i64, Value)>> = vec![
        vec![(0x14, Value::Int(0))],
        vec![(0x30, Value::Int(0))],
        // The expression context belongs to path ops.
        vec![(0x04, Value::Int(0))],
        vec![(-1, Value::Int(0))],
        vec![(CTX_LIST_INDEX, s("a"))],
        vec![(CTX_LIST_INDEX, Value::Double(1.0))],
        vec![(CTX_LIST_INDEX, Value::Nil)],
        vec![(CTX_LIST_RANK, s("a"))],
        vec![(CTX_LIST_INDEX, Value::Int(0)), (0x14, Value::Int(0))],
    ];
    for steps in cases {
        assert_eq!(
            answers(Some(&l), &steps),
            all(CdtError::OpNotApplicable),
            "{steps:?}"
        );
    }
    let m = nested_map();
    assert_eq!(
        answers(Some(&m), &[(CTX_MAP_INDEX, s("a"))]),
        all(CdtError::OpNotApplicable)
    );
}

#[test]
fn type_bits_above_the_create_flags_are_ignored() {
    let l = list(vec![ints(&[1]), ints(&[2])]);
    for kind in [0x210, 0x410, 0x1010, 0x10010] {
        let (_, result) = run(
            Some(&l),
            &payload(Some(ctx(&[(kind, Value::Int(0))])), LIST_SIZE, vec![]),
            false,
        )
        .expect("reads");
        assert_eq!(int_result(result), 1, "{kind:#x}");
    }
}

#[test]
fn a_context_on_a_bin_that_is_no_collection_is_a_parameter_error() {
    let steps = ctx(&[(CTX_LIST_INDEX, Value::Int(0))]);
    let create = ctx(&[(CTX_MAP_KEY | CREATE, s("a"))]);
    for (particle, bytes) in [
        (ParticleType::Integer as u8, vec![0; 8]),
        (ParticleType::String as u8, b"str".to_vec()),
        (ParticleType::Blob as u8, vec![1, 2]),
    ] {
        for (request, modify) in [
            (payload(Some(steps.clone()), LIST_SIZE, vec![]), false),
            (payload(Some(steps.clone()), 63, vec![]), false),
            (
                payload(Some(steps.clone()), LIST_APPEND, vec![Value::Int(1)]),
                true,
            ),
            (
                payload(Some(create.clone()), MAP_PUT, vec![s("k"), Value::Int(1)]),
                true,
            ),
        ] {
            assert_eq!(
                operate(&request, Some((particle, &bytes)), modify).err(),
                Some(CdtError::Parameter),
                "particle {particle}"
            );
        }
        // Without a context the op meets the bin: 12, before its code is
        // looked at.
        for code in [LIST_SIZE, 63] {
            assert_eq!(
                operate(
                    &payload(None, code, vec![]),
                    Some((particle, &bytes)),
                    false
                )
                .err(),
                Some(CdtError::IncompatibleType)
            );
        }
    }
}

#[test]
fn a_context_on_a_missing_bin_answers_nothing_to_a_read_and_26_to_a_write() {
    for steps in [
        vec![(CTX_LIST_INDEX, Value::Int(0))],
        vec![(CTX_MAP_KEY, s("a"))],
        // Only a create on the first step makes the bin.
        vec![
            (CTX_MAP_KEY, s("k")),
            (CTX_LIST_INDEX | CREATE, Value::Int(0)),
        ],
    ] {
        let answers = answers(None, &steps);
        assert_eq!(answers[..2], [None, None], "{steps:?}");
        assert_eq!(
            answers[2..],
            [Some(CdtError::OpNotApplicable); 2],
            "{steps:?}"
        );
    }
    // A read of a missing bin is not even parsed, as the reference's.
    for request in [
        value_bytes(&list(vec![Value::Int(0xff), list(vec![]), ints(&[16])])),
        value_bytes(&list(vec![Value::Int(0xff), ints(&[0x10]), ints(&[16])])),
        payload(None, 63, vec![]),
        payload(None, LIST_APPEND, vec![Value::Int(1)]),
        vec![0xc1],
    ] {
        let outcome = operate(&request, None, false).expect("nothing to read");
        assert!(outcome.bin.is_none() && outcome.result.is_none());
    }
    // With create flags a write makes the bin.
    let (bin, _) = run(
        None,
        &payload(
            Some(ctx(&[(CTX_MAP_KEY | CREATE, s("k"))])),
            LIST_APPEND,
            vec![Value::Int(9)],
        ),
        true,
    )
    .expect("creates");
    assert_eq!(bin, Some(map(vec![(s("k"), ints(&[9]))])));
}

fn value_bytes(value: &Value) -> Vec<u8> {
    crate::value::to_bytes(value)
}

#[test]
fn create_flags_do_not_make_a_read_follow_a_missing_path() {
    let m = nested_map();
    let l = list(vec![ints(&[1, 2])]);
    for (bin, steps) in [
        (&m, vec![(CTX_MAP_KEY | CREATE, s("zz"))]),
        (&m, vec![(CTX_MAP_KEY | 0x80, s("zz"))]),
        (&m, vec![(CTX_MAP_KEY | CREATE, Value::Double(1.5))]),
        (&l, vec![(CTX_LIST_INDEX | CREATE, Value::Int(1))]),
        (&l, vec![(CTX_LIST_INDEX | 0x80, Value::Int(5))]),
    ] {
        let answers = answers(Some(bin), &steps);
        assert_eq!(
            answers[..2],
            [Some(CdtError::OpNotApplicable); 2],
            "{steps:?}"
        );
        assert_eq!(answers[2..], [None, None], "{steps:?}");
    }
    // A create the walk cannot make answers 26 to a write as well: past
    // the end without the unbounded flag, a negative index, a missing
    // step above the create.
    for steps in [
        vec![(CTX_LIST_INDEX | CREATE, Value::Int(5))],
        vec![(CTX_LIST_INDEX | CREATE, Value::Int(-5))],
        vec![
            (CTX_LIST_INDEX, Value::Int(7)),
            (CTX_LIST_INDEX | CREATE, Value::Int(0)),
        ],
        vec![(CTX_LIST_RANK | CREATE, Value::Int(9))],
    ] {
        assert_eq!(
            answers(Some(&l), &steps),
            all(CdtError::OpNotApplicable),
            "{steps:?}"
        );
    }
}

#[test]
fn the_context_is_walked_before_the_op_code_is_judged() {
    let l = list(vec![ints(&[1])]);
    let far = ctx(&[(CTX_LIST_INDEX, Value::Int(5))]);
    let near = ctx(&[(CTX_LIST_INDEX, Value::Int(0))]);
    for modify in [false, true] {
        // An unknown op code.
        let unknown = |steps: &Vec<Value>| payload(Some(steps.clone()), 63, vec![]);
        assert_eq!(
            run(Some(&l), &unknown(&far), modify).err(),
            Some(CdtError::OpNotApplicable)
        );
        assert_eq!(
            run(Some(&l), &unknown(&near), modify).err(),
            Some(CdtError::Parameter)
        );
        // Arguments of the wrong type.
        let bad_args = payload(Some(far.clone()), 24, vec![s("x"), Value::Int(0)]);
        assert_eq!(
            run(Some(&l), &bad_args, modify).err(),
            Some(CdtError::OpNotApplicable)
        );
    }
    // A modifying code sent as a read.
    let append =
        |steps: &Vec<Value>| payload(Some(steps.clone()), LIST_APPEND, vec![Value::Int(1)]);
    assert_eq!(
        run(Some(&l), &append(&far), false).err(),
        Some(CdtError::OpNotApplicable)
    );
    assert_eq!(
        run(Some(&l), &append(&near), false).err(),
        Some(CdtError::Parameter)
    );
    // On a missing bin a write's walk fails first.
    assert_eq!(
        run(None, &payload(Some(near), 63, vec![]), true).err(),
        Some(CdtError::OpNotApplicable)
    );
}

#[test]
fn a_persist_flag_below_a_created_element_answers_26() {
    // The official C client's "test persist index": the flag on a nested
    // step that must create its collection is refused.
    const CREATE_ORDERED_LIST: i64 = 0xc0;
    let append = |bin: Option<&Value>, steps: &[(i64, Value)]| {
        run(
            bin,
            &payload(Some(ctx(steps)), LIST_APPEND, vec![Value::Int(1)]),
            true,
        )
        .map(|(bin, _)| bin)
    };
    let nested = [
        (CTX_LIST_INDEX | CREATE, Value::Int(0)),
        (
            CTX_LIST_INDEX | CREATE_ORDERED_LIST | PERSIST,
            Value::Int(0),
        ),
    ];
    assert_eq!(append(None, &nested).err(), Some(CdtError::OpNotApplicable));
    assert_eq!(
        append(Some(&ints(&[])), &nested).err(),
        Some(CdtError::OpNotApplicable)
    );
    // On the bin's own collection it is taken, and on a step whose
    // collection exists it is ignored.
    let top = [(
        CTX_LIST_INDEX | CREATE_ORDERED_LIST | PERSIST,
        Value::Int(0),
    )];
    assert_eq!(append(None, &top), Ok(Some(list(vec![ints(&[1])]))));
    let existing = list(vec![list(vec![ints(&[1])])]);
    let ignored = [
        (CTX_LIST_INDEX, Value::Int(0)),
        (CTX_LIST_INDEX | PERSIST, Value::Int(0)),
    ];
    assert_eq!(
        append(Some(&existing), &ignored),
        Ok(Some(list(vec![list(vec![ints(&[1, 1])])])))
    );
}
