#![allow(clippy::unwrap_used)]

//! The path walk with a test evaluator: each level's filter and the modify
//! expression are closures (the payload's expression bytes are not read
//! here; the expression crate's tests cover them end to end).

use super::*;

fn s(text: &str) -> Value {
    Value::str(text)
}

fn f(x: f64) -> Value {
    Value::Double(x)
}

fn list(items: Vec<Value>) -> Value {
    Value::List(List { flags: 0, items })
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(Map {
        flags: 0,
        entries: entries.into_iter().map(|(k, v)| (s(k), v)).collect(),
    })
}

fn same(a: &Value, b: &Value) {
    assert_eq!(value::to_bytes(a), value::to_bytes(b), "{a:?} != {b:?}");
}

/// A context level in a payload.
enum Ctx {
    All,
    Filter,
    Step(i64, Value),
    KeysIn(Vec<Value>),
    And,
}

/// `[0xfe, ctx, flags]`, or with a modify expression (any list) when the
/// flags say APPLY.
fn payload(ctx: &[Ctx], flags: i64) -> Vec<u8> {
    let mut pairs = Vec::new();
    for level in ctx {
        match level {
            Ctx::All => pairs.extend([Value::Int(4), Value::Bool(true)]),
            // Any expression: the test evaluator decides.
            Ctx::Filter => pairs.extend([Value::Int(4), list(vec![Value::Int(0)])]),
            Ctx::Step(kind, value) => pairs.extend([Value::Int(*kind), value.clone()]),
            Ctx::KeysIn(keys) => pairs.extend([Value::Int(MAP_KEYS_IN), list(keys.clone())]),
            Ctx::And => pairs.extend([Value::Int(AND_FILTER), list(vec![Value::Int(0)])]),
        }
    }
    let mut items = vec![Value::Int(0xfe), list(pairs), Value::Int(flags)];
    if flags & 0x0f == 4 {
        items.push(list(vec![Value::Int(100)]));
    }
    value::to_bytes(&list(items))
}

type Filter = Box<dyn Fn(&LoopVars<'_>) -> Verdict>;
type Modify = Box<dyn Fn(&LoopVars<'_>) -> Modified>;

struct Test {
    filter: Filter,
    modify: Modify,
}

impl PathEval for Test {
    fn filter(&mut self, _level: usize, vars: &LoopVars<'_>) -> Verdict {
        (self.filter)(vars)
    }
    fn modify(&mut self, vars: &LoopVars<'_>) -> Modified {
        (self.modify)(vars)
    }
}

fn evaluator(filter: Filter, modify: Modify) -> Test {
    Test { filter, modify }
}

fn no_modify() -> Modify {
    Box::new(|_| Modified::Unknown)
}

fn float_at_least(min: f64) -> Filter {
    Box::new(move |vars| match vars.value {
        Value::Double(x) if *x >= min => Verdict::Yes,
        Value::Double(_) => Verdict::No,
        _ => Verdict::Unknown,
    })
}

/// The official clients' example: days of expenses.
fn days() -> Value {
    map(vec![
        ("Day1", map(vec![("book", f(14.99)), ("ferry", f(5.0))])),
        ("Day2", map(vec![("food", f(34.0)), ("game", f(12.99))])),
        (
            "Day3",
            map(vec![("plants", f(19.99)), ("stickers", f(2.0))]),
        ),
    ])
}

fn select(ctx: &[Ctx], flags: i64, root: &Value, eval: &mut Test) -> Result<Value, CdtError> {
    Path::parse(&payload(ctx, flags))?.select(root, eval)
}

#[test]
fn a_filtered_level_selects_values_and_the_matching_tree() {
    let mut eval = evaluator(float_at_least(20.0), no_modify());
    let ctx = [Ctx::All, Ctx::Filter];
    same(
        &select(&ctx, 1, &days(), &mut eval).unwrap(),
        &list(vec![f(34.0)]),
    );
    same(
        &select(&ctx, 0, &days(), &mut eval).unwrap(),
        &map(vec![
            ("Day1", map(vec![])),
            ("Day2", map(vec![("food", f(34.0))])),
            ("Day3", map(vec![])),
        ]),
    );
    // The filter sees the entry's key, and no index, on a map level.
    let mut by_key = evaluator(
        Box::new(|vars| {
            assert!(vars.index.is_none());
            if vars
                .key
                .is_some_and(|key| value::compare(key, &s("book")).is_eq())
            {
                Verdict::Yes
            } else {
                Verdict::No
            }
        }),
        no_modify(),
    );
    same(
        &select(&ctx, 0, &days(), &mut by_key).unwrap(),
        &map(vec![
            ("Day1", map(vec![("book", f(14.99))])),
            ("Day2", map(vec![])),
            ("Day3", map(vec![])),
        ]),
    );
}

#[test]
fn keys_and_key_value_pairs_come_flat_in_stored_order() {
    let mut eval = evaluator(float_at_least(0.0), no_modify());
    let ctx = [Ctx::All, Ctx::All];
    let keys = ["book", "ferry", "food", "game", "plants", "stickers"];
    same(
        &select(&ctx, 2, &days(), &mut eval).unwrap(),
        &list(keys.iter().map(|k| s(k)).collect()),
    );
    let values = [14.99, 5.0, 34.0, 12.99, 19.99, 2.0];
    let pairs: Vec<Value> = keys
        .iter()
        .zip(values)
        .flat_map(|(k, v)| [s(k), f(v)])
        .collect();
    same(&select(&ctx, 3, &days(), &mut eval).unwrap(), &list(pairs));
    // List elements have no key: incompatible, or skipped with NO_FAIL.
    let rows = list(vec![list(vec![Value::Int(1)]), list(vec![Value::Int(2)])]);
    assert_eq!(
        select(&ctx, 2, &rows, &mut eval).unwrap_err(),
        CdtError::IncompatibleType
    );
    same(
        &select(&ctx, 0x12, &rows, &mut eval).unwrap(),
        &list(vec![]),
    );
}

#[test]
fn a_list_level_binds_the_index_and_keeps_order_in_the_tree() {
    let row: Vec<Value> = (10..20).map(Value::Int).collect();
    let rows = list(vec![list(row.clone()); 20]);
    let mut eval = evaluator(
        Box::new(|vars| {
            assert!(vars.key.is_none() && vars.index.is_some());
            match vars.value {
                Value::Int(i) if (14..16).contains(i) => Verdict::Yes,
                _ => Verdict::No,
            }
        }),
        no_modify(),
    );
    let expected = list(vec![list(vec![Value::Int(14), Value::Int(15)]); 20]);
    same(
        &select(&[Ctx::All, Ctx::Filter], 0, &rows, &mut eval).unwrap(),
        &expected,
    );
    let mut first_three = evaluator(
        Box::new(|vars| {
            if vars.index.is_some_and(|i| i < 3) {
                Verdict::Yes
            } else {
                Verdict::No
            }
        }),
        no_modify(),
    );
    same(
        &select(&[Ctx::Filter], 1, &list(row), &mut first_three).unwrap(),
        &list(vec![Value::Int(10), Value::Int(11), Value::Int(12)]),
    );
}

#[test]
fn plain_steps_pick_one_element_or_every_equal_one() {
    let book = |title: &str, price: f64| map(vec![("price", f(price)), ("title", s(title))]);
    let store = map(vec![(
        "book",
        list(vec![
            book("Sayings", 8.95),
            book("Sword", 12.99),
            book("Moby", 8.99),
        ]),
    )]);
    let mut eval = evaluator(float_at_least(0.0), no_modify());
    let ctx = [
        Ctx::Step(MAP_KEY, s("book")),
        Ctx::All,
        Ctx::Step(MAP_KEY, s("title")),
    ];
    same(
        &select(&ctx, 1, &store, &mut eval).unwrap(),
        &list(vec![s("Sayings"), s("Sword"), s("Moby")]),
    );
    let by_index = [
        Ctx::Step(MAP_KEY, s("book")),
        Ctx::Step(LIST_INDEX, Value::Int(-1)),
    ];
    same(
        &select(&by_index, 1, &store, &mut eval).unwrap(),
        &list(vec![book("Moby", 8.99)]),
    );
    // A missing key or index matches nothing, without an error.
    let missing = [Ctx::Step(MAP_KEY, s("music")), Ctx::All];
    same(
        &select(&missing, 1, &store, &mut eval).unwrap(),
        &list(vec![]),
    );
    let past = [
        Ctx::Step(MAP_KEY, s("book")),
        Ctx::Step(LIST_INDEX, Value::Int(7)),
    ];
    same(&select(&past, 1, &store, &mut eval).unwrap(), &list(vec![]));
    // A list step on a map is a parameter error, even with NO_FAIL.
    let wrong = [Ctx::Step(LIST_INDEX, Value::Int(0))];
    assert_eq!(
        select(&wrong, 0x11, &store, &mut eval).unwrap_err(),
        CdtError::Parameter
    );
    // Every element equal to the value.
    let numbers = list(vec![Value::Int(3), Value::Int(1), Value::Int(3)]);
    let threes = [Ctx::Step(LIST_VALUE, Value::Int(3))];
    same(
        &select(&threes, 0, &numbers, &mut eval).unwrap(),
        &list(vec![Value::Int(3), Value::Int(3)]),
    );
    let highest = [Ctx::Step(LIST_RANK, Value::Int(-1))];
    same(
        &select(&highest, 1, &numbers, &mut eval).unwrap(),
        &list(vec![Value::Int(3)]),
    );
}

#[test]
fn an_unknown_filter_fails_unless_no_fail() {
    let mixed = map(vec![("a", Value::Int(1)), ("b", f(30.0)), ("c", s("x"))]);
    let mut eval = evaluator(float_at_least(20.0), no_modify());
    assert_eq!(
        select(&[Ctx::Filter], 1, &mixed, &mut eval).unwrap_err(),
        CdtError::Parameter
    );
    same(
        &select(&[Ctx::Filter], 0x11, &mixed, &mut eval).unwrap(),
        &list(vec![f(30.0)]),
    );
    // A scalar before the last level is skipped, or kept in the tree.
    let mut all = evaluator(Box::new(|_| Verdict::Yes), no_modify());
    let nested = map(vec![
        ("a", Value::Int(1)),
        ("b", map(vec![("c", Value::Int(2))])),
    ]);
    same(
        &select(&[Ctx::All, Ctx::All], 1, &nested, &mut all).unwrap(),
        &list(vec![Value::Int(2)]),
    );
    same(
        &select(&[Ctx::All, Ctx::All], 0, &nested, &mut all).unwrap(),
        &nested,
    );
}

#[test]
fn apply_rewrites_or_removes_the_matched_leaves() {
    let minus_five: Modify = Box::new(|vars| match vars.value {
        Value::Double(x) => Modified::Value(f(x - 5.0)),
        _ => Modified::Unknown,
    });
    let path = Path::parse(&payload(&[Ctx::All, Ctx::All], 4)).unwrap();
    let mut eval = evaluator(Box::new(|_| Verdict::Yes), minus_five);
    let mut root = days();
    path.apply(&mut root, &mut eval).unwrap();
    let mut values = evaluator(Box::new(|_| Verdict::Yes), no_modify());
    same(
        &select(&[Ctx::All, Ctx::All], 1, &root, &mut values).unwrap(),
        &list(
            [14.99, 5.0, 34.0, 12.99, 19.99, 2.0]
                .iter()
                .map(|x| f(x - 5.0))
                .collect(),
        ),
    );
    // `result_remove` takes the leaves out, the containers stay.
    let mut remove = evaluator(Box::new(|_| Verdict::Yes), Box::new(|_| Modified::Remove));
    let mut root = days();
    path.apply(&mut root, &mut remove).unwrap();
    same(
        &root,
        &map(vec![
            ("Day1", map(vec![])),
            ("Day2", map(vec![])),
            ("Day3", map(vec![])),
        ]),
    );
    // An unknown result fails the op (1), or leaves the leaf with NO_FAIL.
    let halve_ints: Modify = Box::new(|vars| match vars.value {
        Value::Int(i) => Modified::Value(Value::Int(i / 2)),
        _ => Modified::Unknown,
    });
    let mixed = list(vec![Value::Int(8), s("x"), Value::Int(4)]);
    let mut eval = evaluator(Box::new(|_| Verdict::Yes), halve_ints);
    let strict = Path::parse(&payload(&[Ctx::All], 4)).unwrap();
    assert_eq!(
        strict.apply(&mut mixed.clone(), &mut eval).unwrap_err(),
        CdtError::ExpressionFailed
    );
    let lenient = Path::parse(&payload(&[Ctx::All], 0x14)).unwrap();
    let mut root = mixed;
    lenient.apply(&mut root, &mut eval).unwrap();
    same(&root, &list(vec![Value::Int(4), s("x"), Value::Int(2)]));
}

#[test]
fn an_ordered_list_is_sorted_again_after_an_apply() {
    let mut root = Value::List(List {
        flags: value::LIST_ORDERED,
        items: vec![Value::Int(1), Value::Int(2), Value::Int(3)],
    });
    let negate: Modify = Box::new(|vars| match vars.value {
        Value::Int(i) => Modified::Value(Value::Int(-i)),
        _ => Modified::Unknown,
    });
    let mut eval = evaluator(Box::new(|_| Verdict::Yes), negate);
    Path::parse(&payload(&[Ctx::All], 4))
        .unwrap()
        .apply(&mut root, &mut eval)
        .unwrap();
    let Value::List(sorted) = &root else {
        panic!("a list");
    };
    same(
        &list(sorted.items.clone()),
        &list(vec![Value::Int(-3), Value::Int(-2), Value::Int(-1)]),
    );
}

#[test]
fn malformed_and_newer_payloads_are_refused() {
    let bytes = |items: Vec<Value>| value::to_bytes(&list(items));
    let all = list(vec![Value::Int(4), Value::Bool(true)]);
    for bad in [
        // No context, an odd one, a context that is no list.
        bytes(vec![Value::Int(0xfe), list(vec![]), Value::Int(1)]),
        bytes(vec![
            Value::Int(0xfe),
            list(vec![Value::Int(4)]),
            Value::Int(1),
        ]),
        bytes(vec![Value::Int(0xfe), Value::Int(4), Value::Int(1)]),
        // Unknown select types; APPLY without an expression; an expression
        // without APPLY; flags that are no integer.
        bytes(vec![Value::Int(0xfe), all.clone(), Value::Int(5)]),
        bytes(vec![Value::Int(0xfe), all.clone(), Value::Int(4)]),
        bytes(vec![
            Value::Int(0xfe),
            all.clone(),
            Value::Int(1),
            list(vec![]),
        ]),
        bytes(vec![Value::Int(0xfe), all.clone(), s("1")]),
        // "All children" with something other than true or an expression.
        bytes(vec![
            Value::Int(0xfe),
            list(vec![Value::Int(4), Value::Int(1)]),
            Value::Int(1),
        ]),
        // An unknown context id; an index that is no integer.
        bytes(vec![
            Value::Int(0xfe),
            list(vec![Value::Int(0x15), Value::Int(1)]),
            Value::Int(1),
        ]),
        bytes(vec![
            Value::Int(0xfe),
            list(vec![Value::Int(LIST_INDEX), s("a")]),
            Value::Int(1),
        ]),
        vec![0x93, 0xcc, 0xfe],
        vec![],
    ] {
        assert_eq!(
            Path::parse(&bad).unwrap_err(),
            CdtError::Parameter,
            "{bad:?}"
        );
    }
    // An and-filter first, after "all children", or twice; keys-in with
    // no list.
    for bad in [
        payload(&[Ctx::And], 1),
        payload(&[Ctx::All, Ctx::And], 1),
        payload(&[Ctx::Filter, Ctx::And], 1),
        payload(&[Ctx::KeysIn(vec![s("a")]), Ctx::And, Ctx::And], 1),
        bytes(vec![
            Value::Int(0xfe),
            list(vec![Value::Int(MAP_KEYS_IN), s("a")]),
            Value::Int(1),
        ]),
    ] {
        assert_eq!(
            Path::parse(&bad).unwrap_err(),
            CdtError::Parameter,
            "{bad:?}"
        );
    }
    // A path's root must be a collection.
    let mut eval = evaluator(Box::new(|_| Verdict::Yes), no_modify());
    assert_eq!(
        select(&[Ctx::All], 1, &Value::Int(1), &mut eval).unwrap_err(),
        CdtError::IncompatibleType
    );
    assert!(is_path(&payload(&[Ctx::All], 1)));
    assert!(!is_path(&bytes(vec![Value::Int(0xff), all, list(vec![])])));
    assert!(!is_path(&[0xc0]));
}

#[test]
fn keys_in_picks_the_named_entries_and_an_and_filter_narrows_them() {
    let m = map(vec![
        ("a", Value::Int(1)),
        ("ab", map(vec![("bb", Value::Int(12))])),
        ("b", Value::Int(2)),
        ("f", Value::Int(3)),
    ]);
    let mut all = evaluator(Box::new(|_| Verdict::Yes), no_modify());
    let named = [Ctx::KeysIn(vec![s("a"), s("z")])];
    same(
        &select(&named, 1, &m, &mut all).unwrap(),
        &list(vec![Value::Int(1)]),
    );
    let none = [Ctx::KeysIn(vec![s("z")])];
    same(&select(&none, 1, &m, &mut all).unwrap(), &list(vec![]));
    // Named twice, or out of order: each entry once, in stored order.
    let twice = [Ctx::KeysIn(vec![s("f"), s("a"), s("f")])];
    same(
        &select(&twice, 2, &m, &mut all).unwrap(),
        &list(vec![s("a"), s("f")]),
    );
    let mut at_least_two = evaluator(
        Box::new(|vars| match vars.value {
            Value::Int(i) if *i >= 2 => Verdict::Yes,
            Value::Int(_) => Verdict::No,
            _ => Verdict::Unknown,
        }),
        no_modify(),
    );
    let narrowed = [Ctx::KeysIn(vec![s("a"), s("b")]), Ctx::And];
    same(
        &select(&narrowed, 1, &m, &mut at_least_two).unwrap(),
        &list(vec![Value::Int(2)]),
    );
    // After a plain step too; keys-in on a list is a parameter error.
    let step_and = [Ctx::Step(LIST_VALUE, Value::Int(3)), Ctx::And];
    let numbers = list(vec![Value::Int(3), Value::Int(1), Value::Int(3)]);
    same(
        &select(&step_and, 1, &numbers, &mut at_least_two).unwrap(),
        &list(vec![Value::Int(3), Value::Int(3)]),
    );
    assert_eq!(
        select(&named, 1, &numbers, &mut all).unwrap_err(),
        CdtError::Parameter
    );
}
