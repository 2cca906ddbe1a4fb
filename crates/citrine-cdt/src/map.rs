//! Map ops (codes 64..128, protocol 05 §2.4): typing and creating maps,
//! put / add / replace / increment, and the get-by / remove-by selectors
//! (by key, index, value and rank; intervals, lists and relative ranges).
//!
//! Model: a map is a [`Value::Map`] whose `entries` are in *stored order*:
//! sorted by key when the map is key-ordered, insertion order otherwise.
//! Selectors never use the stored order directly: an element's *index* is
//! its position in key order (an unordered map is indexed as if it were
//! sorted by key) and its *rank* its position in value order, ties broken
//! by index. [`View`] holds that key order for one op.
//!
//! Result order follows the reference server (8.1.2). Selectors that walk
//! an order (single elements, index and rank ranges, relative ranges) list
//! their elements in that order. Selectors that pick a set (key and value
//! intervals, all-by-value, key and value lists, the complement of a
//! selection, a range covering the whole map) list indexes ascending,
//! ranks of an index-space choice by index and of a value choice
//! ascending, and elements in stored order ([`Listing::Set`]);
//! key-value-ordered maps do the same. Indexes and ranks that number the
//! selector's own space come as stretches ([`crate::result::Shape`]). A
//! key or value listed twice counts at its last listing, except that a
//! key-ordered map answers a key list's indexes, and a map of one entry
//! a value list's indexes and ranks, once for every listing.
//!
//! Invariants: keys are unique; a key-ordered map's entries stay sorted by
//! key (inserts go to the sorted position, [`repaired`] re-sorts a stored
//! map that is not); a stored key is never a list, a map, a wildcard or
//! infinity, nor contains the latter two; [`apply`] never panics on any
//! input; an error leaves `slot` unchanged: every op parses its arguments
//! and computes its result before it mutates, and a map made for an absent
//! slot is stored only when the op succeeds.

use crate::result::{
    index_of, last_occurrences, order_by_value, parse_return_type, range_of, ranks_of,
    resolve_index, Extent, InvertedExists, RankTies, ReturnType, Selection, Shape, Space, Whole,
};
use crate::value::{self, Map, Value, MAP_KEY_ORDERED, MAP_VALUE_ORDERED};
use crate::CdtError;
use std::cmp::Ordering;

// Op codes (05 §2.4). 71, 72, 80 and 101 are unused.
const SET_TYPE: i64 = 64;
const ADD: i64 = 65;
const ADD_ITEMS: i64 = 66;
const PUT: i64 = 67;
const PUT_ITEMS: i64 = 68;
const REPLACE: i64 = 69;
const REPLACE_ITEMS: i64 = 70;
const INCREMENT: i64 = 73;
const DECREMENT: i64 = 74;
const CLEAR: i64 = 75;
const REMOVE_BY_KEY: i64 = 76;
const REMOVE_BY_INDEX: i64 = 77;
const REMOVE_BY_VALUE: i64 = 78;
const REMOVE_BY_RANK: i64 = 79;
const REMOVE_BY_KEY_LIST: i64 = 81;
const REMOVE_ALL_BY_VALUE: i64 = 82;
const REMOVE_BY_VALUE_LIST: i64 = 83;
const REMOVE_BY_KEY_INTERVAL: i64 = 84;
const REMOVE_BY_INDEX_RANGE: i64 = 85;
const REMOVE_BY_VALUE_INTERVAL: i64 = 86;
const REMOVE_BY_RANK_RANGE: i64 = 87;
const REMOVE_BY_KEY_REL_INDEX_RANGE: i64 = 88;
const REMOVE_BY_VALUE_REL_RANK_RANGE: i64 = 89;
const SIZE: i64 = 96;
const GET_BY_KEY: i64 = 97;
const GET_BY_INDEX: i64 = 98;
const GET_BY_VALUE: i64 = 99;
const GET_BY_RANK: i64 = 100;
const GET_ALL_BY_VALUE: i64 = 102;
const GET_BY_KEY_INTERVAL: i64 = 103;
const GET_BY_INDEX_RANGE: i64 = 104;
const GET_BY_VALUE_INTERVAL: i64 = 105;
const GET_BY_RANK_RANGE: i64 = 106;
const GET_BY_KEY_LIST: i64 = 107;
const GET_BY_VALUE_LIST: i64 = 108;
const GET_BY_KEY_REL_INDEX_RANGE: i64 = 109;
const GET_BY_VALUE_REL_RANK_RANGE: i64 = 110;

// Map write flags (PUT / PUT_ITEMS).
const CREATE_ONLY: u64 = 0x01;
const UPDATE_ONLY: u64 = 0x02;
const NO_FAIL: u64 = 0x04;
const PARTIAL: u64 = 0x08;

/// The order bits of a map's flags.
const ORDER_MASK: u8 = MAP_KEY_ORDERED | MAP_VALUE_ORDERED;

/// Whether a map op code modifies (`Some(true)`), reads (`Some(false)`) or
/// is no map op at all (`None`).
pub(crate) fn is_modify(code: i64) -> Option<bool> {
    match code {
        SET_TYPE..=REPLACE_ITEMS
        | INCREMENT..=REMOVE_BY_RANK
        | REMOVE_BY_KEY_LIST..=REMOVE_BY_VALUE_REL_RANK_RANGE => Some(true),
        SIZE..=GET_BY_RANK | GET_ALL_BY_VALUE..=GET_BY_VALUE_REL_RANK_RANGE => Some(false),
        _ => None,
    }
}

/// Applies map op `code` with `args` (the op's arguments after the code) to
/// `slot` (`None`: the bin or element is absent). Returns the op's result.
pub(crate) fn apply(
    code: i64,
    args: &[Value],
    slot: &mut Option<Value>,
) -> Result<Option<Value>, CdtError> {
    let modify = is_modify(code).ok_or(CdtError::Parameter)?;
    if matches!(slot, Some(found) if !matches!(found, Value::Map(_))) {
        return Err(CdtError::IncompatibleType);
    }
    if let Some(selector) = Selector::of(code) {
        return select(selector, modify, args, slot);
    }
    match code {
        SET_TYPE => set_type(args, slot),
        ADD => {
            arity(args, 2, 1)?;
            let (key, value) = storable_entry(&args[0], &args[1])?;
            let order = order_flags(opt_flags(args.get(2))?);
            on_map(slot, Some(order), |map| {
                put_one(map, key, value, Policy::ADD)
            })
        }
        ADD_ITEMS => {
            arity(args, 1, 1)?;
            let items = storable_items(&args[0])?;
            let order = order_flags(opt_flags(args.get(1))?);
            on_map(slot, Some(order), |map| put_items(map, items, Policy::ADD))
        }
        PUT => {
            arity(args, 2, 2)?;
            let (key, value) = storable_entry(&args[0], &args[1])?;
            let order = order_flags(opt_flags(args.get(2))?);
            let policy = Policy::from_write_flags(opt_flags(args.get(3))?);
            on_map(slot, Some(order), |map| put_one(map, key, value, policy))
        }
        PUT_ITEMS => {
            arity(args, 1, 2)?;
            let items = storable_items(&args[0])?;
            let order = order_flags(opt_flags(args.get(1))?);
            let policy = Policy::from_write_flags(opt_flags(args.get(2))?);
            on_map(slot, Some(order), |map| put_items(map, items, policy))
        }
        REPLACE => {
            arity(args, 2, 0)?;
            let (key, value) = storable_entry(&args[0], &args[1])?;
            // An absent map has no key to replace: the put fails, nothing
            // is created.
            on_map(slot, Some(0), |map| {
                put_one(map, key, value, Policy::REPLACE)
            })
        }
        REPLACE_ITEMS => {
            if slot.is_none() {
                return Err(CdtError::ElementNotFound);
            }
            arity(args, 1, 0)?;
            let items = storable_items(&args[0])?;
            on_map(slot, None, |map| put_items(map, items, Policy::REPLACE))
        }
        INCREMENT | DECREMENT => increment(args, slot, code == DECREMENT),
        CLEAR => {
            // Arguments are not read, as the reference.
            on_map(slot, None, |map| {
                map.entries.clear();
                Ok(None)
            })
        }
        SIZE => Ok(match slot {
            Some(Value::Map(map)) => Some(Value::Int(len_i64(map.entries.len()))),
            _ => None,
        }),
        _ => Err(CdtError::Parameter),
    }
}

// ---------------------------------------------------------------------------
// Arguments

/// Refuses fewer than `required` or more than `required + optional` args.
fn arity(args: &[Value], required: usize, optional: usize) -> Result<(), CdtError> {
    if args.len() < required || args.len() > required + optional {
        return Err(CdtError::Parameter);
    }
    Ok(())
}

/// A signed index or rank argument.
fn int_arg(arg: &Value) -> Result<i64, CdtError> {
    arg.as_int().ok_or(CdtError::Parameter)
}

/// An unsigned argument (flags, counts): negative or non-integer refused.
fn uint_arg(arg: &Value) -> Result<u64, CdtError> {
    match arg {
        Value::Int(i) => u64::try_from(*i).map_err(|_| CdtError::Parameter),
        Value::UInt(u) => Ok(*u),
        _ => Err(CdtError::Parameter),
    }
}

/// An optional flags argument (absent: 0).
fn opt_flags(arg: Option<&Value>) -> Result<u64, CdtError> {
    arg.map_or(Ok(0), uint_arg)
}

/// The count a range takes when none is given: the reference's default.
/// (With it a start far before the first element selects nothing, as
/// there.)
const DEFAULT_COUNT: u64 = u32::MAX as u64;

/// An optional count argument (absent: [`DEFAULT_COUNT`]). The wire count
/// is unsigned, so a negative one (the Go client's -1) is read as its
/// two's-complement bits: a huge count, "to the end".
fn opt_count(arg: Option<&Value>) -> Result<u64, CdtError> {
    match arg {
        None => Ok(DEFAULT_COUNT),
        Some(Value::Int(count)) => Ok(*count as u64),
        Some(Value::UInt(count)) => Ok(*count),
        Some(_) => Err(CdtError::Parameter),
    }
}

/// A count as the signed count [`range_of`] takes.
fn count_i64(count: u64) -> Option<i64> {
    Some(i64::try_from(count).unwrap_or(i64::MAX))
}

fn list_arg(arg: &Value) -> Result<&[Value], CdtError> {
    match arg {
        Value::List(list) => Ok(&list.items),
        _ => Err(CdtError::Parameter),
    }
}

/// The map flags a create attribute asks for: 1 key-ordered, 3
/// key-value-ordered, anything else unordered (the persist-index bit and
/// other bits are accepted and dropped).
fn order_flags(attr: u64) -> u8 {
    match attr & u64::from(ORDER_MASK) {
        3 => MAP_KEY_ORDERED | MAP_VALUE_ORDERED,
        1 => MAP_KEY_ORDERED,
        _ => 0,
    }
}

fn len_i64(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

/// Refuses values that cannot be stored: the wildcard and infinity helpers,
/// anywhere inside.
fn check_storable(value: &Value) -> Result<(), CdtError> {
    match value {
        Value::Wildcard | Value::Infinity => Err(CdtError::Parameter),
        Value::List(list) => list.items.iter().try_for_each(check_storable),
        Value::Map(map) => map.entries.iter().try_for_each(|(k, v)| {
            check_storable(k)?;
            check_storable(v)
        }),
        _ => Ok(()),
    }
}

/// Refuses keys that cannot be stored: collections, exts (the reference
/// refuses every ext key; one stored first would read back as the map's
/// flags header and its entry would be lost), and what [`check_storable`]
/// refuses.
pub(crate) fn check_key(key: &Value) -> Result<(), CdtError> {
    if key.is_collection() || matches!(key, Value::Ext(..)) {
        return Err(CdtError::Parameter);
    }
    check_storable(key)
}

fn storable_entry(key: &Value, value: &Value) -> Result<(Value, Value), CdtError> {
    check_key(key)?;
    check_storable(value)?;
    Ok((key.clone(), value.clone()))
}

/// An items argument: a map whose entries can all be stored.
fn storable_items(arg: &Value) -> Result<Vec<(Value, Value)>, CdtError> {
    let Value::Map(items) = arg else {
        return Err(CdtError::Parameter);
    };
    items
        .entries
        .iter()
        .map(|(k, v)| storable_entry(k, v))
        .collect()
}

// ---------------------------------------------------------------------------
// Writing

/// What a put may do with a key it finds / does not find.
#[derive(Clone, Copy, Debug)]
struct Policy {
    /// A missing key may be created (not UPDATE_ONLY).
    create: bool,
    /// An existing key may be overwritten (not CREATE_ONLY).
    overwrite: bool,
    /// A refused item is skipped instead of failing the op.
    no_fail: bool,
    /// With `no_fail`: the other items are still written.
    partial: bool,
}

impl Policy {
    /// The legacy ADD forms: create only.
    const ADD: Policy = Policy {
        create: true,
        overwrite: false,
        no_fail: false,
        partial: false,
    };
    /// The legacy REPLACE forms: update only.
    const REPLACE: Policy = Policy {
        create: false,
        overwrite: true,
        no_fail: false,
        partial: false,
    };

    fn from_write_flags(flags: u64) -> Policy {
        Policy {
            create: flags & UPDATE_ONLY == 0,
            overwrite: flags & CREATE_ONLY == 0,
            no_fail: flags & NO_FAIL != 0,
            partial: flags & PARTIAL != 0,
        }
    }

    /// The error for a key found (`exists`) or not, if the policy refuses it.
    fn refusal(self, exists: bool) -> Option<CdtError> {
        match exists {
            true if !self.overwrite => Some(CdtError::ElementExists),
            false if !self.create => Some(CdtError::ElementNotFound),
            _ => None,
        }
    }
}

/// Runs `op` on the slot's map. An absent slot: with `create` (the new
/// map's flags) `op` runs on a new empty map that is stored only if `op`
/// succeeds; without, the op does nothing and answers nothing. `op` must
/// not mutate the map when it fails.
fn on_map(
    slot: &mut Option<Value>,
    create: Option<u8>,
    op: impl FnOnce(&mut Map) -> Result<Option<Value>, CdtError>,
) -> Result<Option<Value>, CdtError> {
    match slot {
        Some(Value::Map(map)) => match repaired(map) {
            None => op(map),
            Some(mut fixed) => {
                let result = op(&mut fixed)?;
                *map = fixed;
                Ok(result)
            }
        },
        Some(_) => Err(CdtError::IncompatibleType),
        None => {
            let Some(flags) = create else {
                return Ok(None);
            };
            let mut fresh = Map {
                flags,
                entries: Vec::new(),
            };
            let result = op(&mut fresh)?;
            *slot = Some(Value::Map(fresh));
            Ok(result)
        }
    }
}

/// A key-ordered map stored out of order or with duplicate keys (written
/// whole by a client), sorted with the first of equal keys kept; `None`
/// when the map is canonical.
fn repaired(map: &Map) -> Option<Map> {
    if !map.is_key_ordered() || strictly_sorted(&map.entries) {
        return None;
    }
    let mut fixed = map.clone();
    fixed
        .entries
        .sort_by(|(a, _), (b, _)| value::compare_total(a, b));
    fixed
        .entries
        .dedup_by(|later, earlier| value::compare(&later.0, &earlier.0) == Ordering::Equal);
    Some(fixed)
}

fn strictly_sorted(entries: &[(Value, Value)]) -> bool {
    entries
        .windows(2)
        .all(|pair| value::compare(&pair[0].0, &pair[1].0) == Ordering::Less)
}

fn debug_check(map: &Map) {
    debug_assert!(
        !map.is_key_ordered() || strictly_sorted(&map.entries),
        "key-ordered map out of order"
    );
}

/// Where `key` goes in a key-ordered map: after every smaller key.
fn insert_position(map: &Map, key: &Value) -> usize {
    map.entries
        .partition_point(|(k, _)| value::compare(k, key) == Ordering::Less)
}

/// Sets `key` to `value`: in place when the key exists, else at its sorted
/// position (key-ordered) or at the end (unordered).
fn upsert(map: &mut Map, key: Value, value: Value) {
    match index_of(map, &key) {
        Some(at) => map.entries[at].1 = value,
        None if map.is_key_ordered() => {
            let at = insert_position(map, &key);
            map.entries.insert(at, (key, value));
        }
        None => map.entries.push((key, value)),
    }
    debug_check(map);
}

fn size_result(map: &Map) -> Result<Option<Value>, CdtError> {
    Ok(Some(Value::Int(len_i64(map.entries.len()))))
}

/// PUT / ADD / REPLACE of one entry; answers the map's size.
fn put_one(
    map: &mut Map,
    key: Value,
    value: Value,
    policy: Policy,
) -> Result<Option<Value>, CdtError> {
    if let Some(refused) = policy.refusal(index_of(map, &key).is_some()) {
        return if policy.no_fail {
            size_result(map)
        } else {
            Err(refused)
        };
    }
    upsert(map, key, value);
    size_result(map)
}

/// PUT_ITEMS / ADD_ITEMS / REPLACE_ITEMS; answers the map's size.
///
/// Items are taken in key order, the last of equal keys winning. A refused
/// item fails the op, or with NO_FAIL makes it a no-op, or with NO_FAIL and
/// PARTIAL is skipped. In an unordered map the written items go to the end
/// in key order (an overwritten entry moves there), as the reference.
fn put_items(
    map: &mut Map,
    items: Vec<(Value, Value)>,
    policy: Policy,
) -> Result<Option<Value>, CdtError> {
    let mut sorted = items;
    sorted.sort_by(|(a, _), (b, _)| value::compare_total(a, b));
    let mut unique: Vec<(Value, Value)> = Vec::with_capacity(sorted.len());
    for (key, value) in sorted {
        match unique.last_mut() {
            Some(last) if value::compare(&last.0, &key) == Ordering::Equal => *last = (key, value),
            _ => unique.push((key, value)),
        }
    }

    let mut accepted = Vec::with_capacity(unique.len());
    let mut overwritten = Vec::new();
    for (key, value) in unique {
        let found = index_of(map, &key);
        match policy.refusal(found.is_some()) {
            None => {
                overwritten.extend(found);
                accepted.push((key, value));
            }
            Some(refused) if !policy.no_fail => return Err(refused),
            Some(_) if !policy.partial => return size_result(map),
            Some(_) => {}
        }
    }

    if map.is_key_ordered() {
        // Overwrite in place, then merge the new keys in (stable sort of
        // unique keys).
        let mut fresh = Vec::new();
        for (key, value) in accepted {
            match index_of(map, &key) {
                Some(at) => map.entries[at].1 = value,
                None => fresh.push((key, value)),
            }
        }
        if !fresh.is_empty() {
            map.entries.extend(fresh);
            map.entries
                .sort_by(|(a, _), (b, _)| value::compare_total(a, b));
        }
    } else {
        remove_positions(map, &overwritten);
        map.entries.extend(accepted);
    }
    debug_check(map);
    size_result(map)
}

/// SET_TYPE: the map's order changes (sorted when it becomes key-ordered);
/// an absent map is created empty.
fn set_type(args: &[Value], slot: &mut Option<Value>) -> Result<Option<Value>, CdtError> {
    arity(args, 1, 0)?;
    let attr = uint_arg(&args[0])?;
    if attr & u64::from(ORDER_MASK) == u64::from(MAP_VALUE_ORDERED) {
        // Value-ordered without key-ordered.
        return Err(CdtError::OpNotApplicable);
    }
    let flags = order_flags(attr);
    on_map(slot, Some(flags), |map| {
        map.flags = flags;
        if map.is_key_ordered() {
            // An unordered map written whole may hold a key twice.
            value::sort_unique_keys(&mut map.entries);
        }
        debug_check(map);
        Ok(None)
    })
}

/// The delta of an increment.
#[derive(Clone, Copy, Debug)]
enum Delta {
    Int(i64),
    Double(f64),
}

/// INCREMENT / DECREMENT: `[key, delta?, attr?]`. A missing key starts
/// from 0; a missing or nil delta is 1. The stored value keeps its type: an
/// integer plus a double delta adds the delta truncated, a double plus an
/// integer delta adds it converted; a missing key takes the delta's type.
/// A value that is not a number is a parameter error (the reference).
fn increment(
    args: &[Value],
    slot: &mut Option<Value>,
    decrement: bool,
) -> Result<Option<Value>, CdtError> {
    arity(args, 1, 2)?;
    let key = &args[0];
    check_key(key)?;
    let delta = match args.get(1) {
        None | Some(Value::Nil) => Delta::Int(1),
        Some(Value::Int(i)) => Delta::Int(*i),
        Some(Value::Double(d)) => Delta::Double(*d),
        Some(_) => return Err(CdtError::Parameter),
    };
    let delta = match (delta, decrement) {
        (Delta::Int(i), true) => Delta::Int(i.wrapping_neg()),
        (Delta::Double(d), true) => Delta::Double(-d),
        (delta, false) => delta,
    };
    let order = order_flags(opt_flags(args.get(2))?);
    on_map(slot, Some(order), |map| {
        let current = index_of(map, key).map(|at| &map.entries[at].1);
        let updated = match (current, delta) {
            (None, Delta::Int(d)) => Value::Int(d),
            (None, Delta::Double(d)) => Value::Double(d),
            (Some(Value::Int(v)), Delta::Int(d)) => Value::Int(v.wrapping_add(d)),
            // Truncation toward zero, saturating, like the reference's cast.
            (Some(Value::Int(v)), Delta::Double(d)) => Value::Int(v.wrapping_add(d as i64)),
            (Some(Value::Double(v)), Delta::Int(d)) => Value::Double(v + d as f64),
            (Some(Value::Double(v)), Delta::Double(d)) => Value::Double(v + d),
            (Some(_), _) => return Err(CdtError::Parameter),
        };
        upsert(map, key.clone(), updated.clone());
        Ok(Some(updated))
    })
}

/// Removes the entries at stored positions `positions` (any order,
/// duplicates and out-of-range positions ignored).
fn remove_positions(map: &mut Map, positions: &[usize]) {
    if positions.is_empty() {
        return;
    }
    let mut doomed = vec![false; map.entries.len()];
    for &at in positions {
        if let Some(flag) = doomed.get_mut(at) {
            *flag = true;
        }
    }
    let mut at = 0;
    map.entries.retain(|_| {
        let keep = !doomed.get(at).copied().unwrap_or(false);
        at += 1;
        keep
    });
}

// ---------------------------------------------------------------------------
// Selecting

/// The get-by / remove-by families (each has a read and a modify code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Selector {
    Key,
    Index,
    Value,
    Rank,
    AllByValue,
    KeyList,
    ValueList,
    KeyInterval,
    IndexRange,
    ValueInterval,
    RankRange,
    KeyRelIndexRange,
    ValueRelRankRange,
}

impl Selector {
    fn of(code: i64) -> Option<Selector> {
        Some(match code {
            REMOVE_BY_KEY | GET_BY_KEY => Selector::Key,
            REMOVE_BY_INDEX | GET_BY_INDEX => Selector::Index,
            REMOVE_BY_VALUE | GET_BY_VALUE => Selector::Value,
            REMOVE_BY_RANK | GET_BY_RANK => Selector::Rank,
            REMOVE_ALL_BY_VALUE | GET_ALL_BY_VALUE => Selector::AllByValue,
            REMOVE_BY_KEY_LIST | GET_BY_KEY_LIST => Selector::KeyList,
            REMOVE_BY_VALUE_LIST | GET_BY_VALUE_LIST => Selector::ValueList,
            REMOVE_BY_KEY_INTERVAL | GET_BY_KEY_INTERVAL => Selector::KeyInterval,
            REMOVE_BY_INDEX_RANGE | GET_BY_INDEX_RANGE => Selector::IndexRange,
            REMOVE_BY_VALUE_INTERVAL | GET_BY_VALUE_INTERVAL => Selector::ValueInterval,
            REMOVE_BY_RANK_RANGE | GET_BY_RANK_RANGE => Selector::RankRange,
            REMOVE_BY_KEY_REL_INDEX_RANGE | GET_BY_KEY_REL_INDEX_RANGE => {
                Selector::KeyRelIndexRange
            }
            REMOVE_BY_VALUE_REL_RANK_RANGE | GET_BY_VALUE_REL_RANK_RANGE => {
                Selector::ValueRelRankRange
            }
            _ => return None,
        })
    }

    /// Whether the op names one element (scalar results, no INVERTED).
    fn single(self) -> bool {
        matches!(
            self,
            Selector::Key | Selector::Index | Selector::Value | Selector::Rank
        )
    }

    /// (required, optional) argument counts, the return type included.
    fn arity(self) -> (usize, usize) {
        match self {
            Selector::KeyInterval
            | Selector::IndexRange
            | Selector::ValueInterval
            | Selector::RankRange => (2, 1),
            Selector::KeyRelIndexRange | Selector::ValueRelRankRange => (3, 1),
            _ => (2, 0),
        }
    }
}

/// One map seen in key order.
struct View<'a> {
    map: &'a Map,
    /// Stored positions in key order: `by_key[index]` is the entry's
    /// position in `map.entries`.
    by_key: Vec<usize>,
}

impl<'a> View<'a> {
    fn new(map: &'a Map) -> View<'a> {
        let by_key = if map.is_key_ordered() && strictly_sorted(&map.entries) {
            (0..map.entries.len()).collect()
        } else {
            order_by_value(map.entries.iter().map(|(k, _)| k))
        };
        View { map, by_key }
    }

    fn len(&self) -> usize {
        self.by_key.len()
    }

    fn key(&self, index: usize) -> &'a Value {
        &self.map.entries[self.by_key[index]].0
    }

    fn value(&self, index: usize) -> &'a Value {
        &self.map.entries[self.by_key[index]].1
    }

    fn keys(&self) -> Vec<&'a Value> {
        (0..self.len()).map(|i| self.key(i)).collect()
    }

    fn values(&self) -> Vec<&'a Value> {
        (0..self.len()).map(|i| self.value(i)).collect()
    }

    /// Indexes in rank order.
    fn rank_order(&self) -> Vec<usize> {
        order_by_value((0..self.len()).map(|i| self.value(i)))
    }

    /// `ranks[index]`.
    fn ranks(&self) -> Vec<usize> {
        ranks_of((0..self.len()).map(|i| self.value(i)))
    }

    fn key_value_ordered(&self) -> bool {
        self.map.flags & ORDER_MASK == ORDER_MASK
    }

    /// Indexes whose value equals `pattern` (wildcards match), index order.
    fn values_matching(&self, pattern: &Value) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| equal(self.value(i), pattern))
            .collect()
    }

    /// Indexes whose key equals `pattern` (wildcards match), index order.
    /// How many values sort before `value` (where its rank run starts).
    fn values_below(&self, value: &Value) -> usize {
        (0..self.len())
            .filter(|&i| value::compare(self.value(i), value) == Ordering::Less)
            .count()
    }

    /// How many keys sort before `key` (where its index run starts).
    fn keys_below(&self, key: &Value) -> usize {
        (0..self.len())
            .filter(|&i| value::compare(self.key(i), key) == Ordering::Less)
            .count()
    }

    fn keys_matching(&self, pattern: &Value) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| equal(self.key(i), pattern))
            .collect()
    }
}

fn equal(a: &Value, b: &Value) -> bool {
    value::compare(a, b) == Ordering::Equal
}

/// `begin <= v < end` (no end: no upper bound).
fn in_interval(v: &Value, begin: &Value, end: Option<&Value>) -> bool {
    value::compare(v, begin) != Ordering::Less
        && end.is_none_or(|end| value::compare(v, end) == Ordering::Less)
}

/// How a selection's result lists its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listing {
    /// In the order the selector chose them.
    Walk,
    /// A set: indexes and ranks ascending, elements in stored order.
    Set,
}

/// A selector's choice, as indexes (key order).
struct Picked {
    chosen: Vec<usize>,
    listing: Listing,
    /// The complement is wanted ([`Selection::invert`]; listed as a set).
    invert: bool,
    /// How the reference describes the choice beyond its elements.
    shape: Option<Shape>,
}

impl Picked {
    fn walk(chosen: Vec<usize>) -> Picked {
        Picked {
            chosen,
            listing: Listing::Walk,
            invert: false,
            shape: None,
        }
    }

    fn set(chosen: Vec<usize>) -> Picked {
        Picked {
            chosen,
            listing: Listing::Set,
            invert: false,
            shape: None,
        }
    }

    fn shaped(mut self, shape: Shape) -> Picked {
        self.shape = Some(shape);
        self
    }
}

/// The shape of a value match or interval (the reference's rules:
/// inverted, EXISTS says whether nothing matched in a non-empty map).
fn by_values_shape(extent: Extent) -> Shape {
    Shape::new(Space::Rank, extent)
        .whole(Whole::IndexResultsWhenInverted)
        .exists(InvertedExists::NothingChosen)
}

/// What EXISTS of an inverted key or index range answers: on a key-ordered
/// map whether anything is left; on an unordered one, for a key interval
/// whether nothing matched (an empty map included), for an index range
/// whether what is left is one stretch (the reference's).
fn range_exists(key_ordered: bool, key_interval: bool) -> InvertedExists {
    match (key_ordered, key_interval) {
        (true, _) => InvertedExists::Complement,
        (false, true) => InvertedExists::NoMatch,
        (false, false) => InvertedExists::OneStretch,
    }
}

/// The range of positions `chosen` takes from `start` in its space.
fn stretch(start: usize, chosen: &Picked) -> Extent {
    Extent::range(start, start + chosen.chosen.len())
}

/// A get-by (`modify` false) or remove-by op.
fn select(
    selector: Selector,
    modify: bool,
    args: &[Value],
    slot: &mut Option<Value>,
) -> Result<Option<Value>, CdtError> {
    if modify {
        // Nothing to remove from an absent map: no result, nothing created
        // (the reference returns before reading the arguments).
        return on_map(slot, None, |map| select_in(map, selector, true, args));
    }
    match slot {
        None => Ok(None),
        Some(Value::Map(map)) => select_in(map, selector, false, args),
        Some(_) => Err(CdtError::IncompatibleType),
    }
}

/// Runs a selector on `map`; a remove-by (`modify`) removes what it
/// selected, once everything else succeeded.
fn select_in(
    map: &mut Map,
    selector: Selector,
    modify: bool,
    args: &[Value],
) -> Result<Option<Value>, CdtError> {
    let (required, optional) = selector.arity();
    arity(args, required, optional)?;
    let (rt, inverted) = parse_return_type(args.first())?;

    let (result, doomed) = {
        let view = View::new(map);
        let picked = pick(&view, selector, args, rt, inverted)?;
        if selector.single() && inverted {
            return Err(CdtError::OpNotApplicable);
        }
        answer(&view, picked, rt, selector.single(), inverted)?
    };
    if modify {
        remove_positions(map, &doomed);
        debug_check(map);
    }
    Ok(result)
}

/// What `selector` chooses (arguments after the return type in `args[1..]`).
fn pick(
    view: &View,
    selector: Selector,
    args: &[Value],
    rt: ReturnType,
    inverted: bool,
) -> Result<Picked, CdtError> {
    let len = view.len();
    let arg = |i: usize| args.get(i).ok_or(CdtError::Parameter);
    let picked = match selector {
        Selector::Key => Picked::walk(view.keys_matching(arg(1)?).into_iter().take(1).collect()),
        Selector::Index => {
            let index = resolve_index(int_arg(arg(1)?)?, len).ok_or(CdtError::OpNotApplicable)?;
            Picked::walk(vec![index])
        }
        Selector::Rank => {
            let rank = resolve_index(int_arg(arg(1)?)?, len).ok_or(CdtError::OpNotApplicable)?;
            Picked::walk(vec![view.rank_order()[rank]])
        }
        Selector::Value => first_by_value(view, arg(1)?),
        Selector::AllByValue => all_by_value(view, arg(1)?),
        Selector::ValueInterval => value_interval(view, arg(1)?, args.get(2)),
        Selector::KeyInterval => key_interval(view, arg(1)?, args.get(2)),
        Selector::KeyList => key_list(view, list_arg(arg(1)?)?, rt, inverted)?,
        Selector::ValueList => value_list(view, list_arg(arg(1)?)?, rt, inverted),
        Selector::IndexRange => {
            let (index, count) = (int_arg(arg(1)?)?, opt_count(args.get(2))?);
            return index_range(view, index, count_i64(count), inverted);
        }
        Selector::RankRange => {
            let (rank, count) = (int_arg(arg(1)?)?, opt_count(args.get(2))?);
            return rank_range(view, rank, count_i64(count), inverted);
        }
        Selector::KeyRelIndexRange => {
            let anchor = arg(1)?;
            let (offset, count) = (int_arg(arg(2)?)?, opt_count(args.get(3))?);
            let anchor = count_below(view, |i| view.key(i), anchor);
            let (index, count) = relative(anchor, offset, count);
            return index_range(view, index, count, inverted);
        }
        Selector::ValueRelRankRange => {
            let anchor = arg(1)?;
            let (offset, count) = (int_arg(arg(2)?)?, opt_count(args.get(3))?);
            let anchor = count_below(view, |i| view.value(i), anchor);
            let (rank, count) = relative(anchor, offset, count);
            return rank_range(view, rank, count, inverted);
        }
    };
    Ok(invert_as_set(picked, inverted))
}

/// An inverted selection lists what it leaves as a set.
fn invert_as_set(mut picked: Picked, inverted: bool) -> Picked {
    if inverted {
        picked.invert = true;
        picked.listing = Listing::Set;
    }
    picked
}

/// How many entries sort below `anchor` by the item `item_of` gives.
fn count_below<'v>(view: &'v View, item_of: impl Fn(usize) -> &'v Value, anchor: &Value) -> usize {
    (0..view.len())
        .filter(|&i| value::compare(item_of(i), anchor) == Ordering::Less)
        .count()
}

/// One element by value: the lowest rank (key-value-ordered maps) or the
/// first stored.
fn first_by_value(view: &View, pattern: &Value) -> Picked {
    let first = if view.key_value_ordered() {
        view.rank_order()
            .into_iter()
            .find(|&i| equal(view.value(i), pattern))
    } else {
        view.values_matching(pattern)
            .into_iter()
            .min_by_key(|&i| view.by_key[i])
    };
    Picked::walk(first.into_iter().collect())
}

/// Every element whose value matches `pattern`.
fn all_by_value(view: &View, pattern: &Value) -> Picked {
    let picked = by_values(view.values_matching(pattern));
    let extent = stretch(view.values_below(pattern), &picked);
    picked.shaped(by_values_shape(extent))
}

/// Every element whose value is in `[begin, end)`.
fn value_interval(view: &View, begin: &Value, end: Option<&Value>) -> Picked {
    let matches = (0..view.len())
        .filter(|&i| in_interval(view.value(i), begin, end))
        .collect();
    let picked = by_values(matches);
    let extent = stretch(view.values_below(begin), &picked);
    picked.shaped(by_values_shape(extent))
}

/// Every element whose key is in `[begin, end)`: a key-ordered map walks
/// its index range; an unordered one picks a set and keeps an empty
/// interval's split.
fn key_interval(view: &View, begin: &Value, end: Option<&Value>) -> Picked {
    let matches: Vec<usize> = (0..view.len())
        .filter(|&i| in_interval(view.key(i), begin, end))
        .collect();
    let key_ordered = view.map.is_key_ordered();
    let picked = if key_ordered {
        Picked::walk(matches)
    } else {
        Picked::set(matches)
    };
    let start = view.keys_below(begin);
    let extent = Extent::Range {
        start,
        end: start + picked.chosen.len(),
        split: !key_ordered,
    };
    let whole = if key_ordered {
        Whole::Always
    } else {
        Whole::Never
    };
    let shape = Shape::new(Space::Index, extent)
        .whole(whole)
        .exists(range_exists(key_ordered, true));
    picked.shaped(shape)
}

/// The elements of the listed keys. Indexes come in list order, everything
/// else as a set. A key listed again: a key-ordered map answers its index
/// again; an unordered one counts its last listing only.
fn key_list(
    view: &View,
    keys: &[Value],
    rt: ReturnType,
    inverted: bool,
) -> Result<Picked, CdtError> {
    if matches!(rt, ReturnType::Rank | ReturnType::ReverseRank) {
        return Err(CdtError::OpNotApplicable);
    }
    let in_list_order = matches!(rt, ReturnType::Index | ReturnType::ReverseIndex);
    let key_ordered = view.map.is_key_ordered();
    let repeat = key_ordered && in_list_order && !inverted;
    let listed = listing_order(keys, key_ordered);
    let chosen = matches_of(listed, repeat, view.len(), |key| view.keys_matching(key));
    let picked = if in_list_order {
        Picked::walk(chosen)
    } else {
        Picked::set(chosen)
    };
    // A key-ordered map lists what a key list leaves out element by
    // element; an unordered one by runs (the reference's).
    if key_ordered {
        return Ok(picked);
    }
    Ok(picked.shaped(Shape::new(Space::Index, Extent::Set)))
}

/// The elements of the listed values. A value listed again counts its last
/// listing only, but a map of one entry answers its numbers again for each
/// listing. Ranks come in list order, rank order within one value;
/// everything else as a set.
fn value_list(view: &View, patterns: &[Value], rt: ReturnType, inverted: bool) -> Picked {
    let order = view.rank_order();
    let numbered = matches!(
        rt,
        ReturnType::Index | ReturnType::ReverseIndex | ReturnType::Rank | ReturnType::ReverseRank
    );
    let repeat = view.len() == 1 && numbered && !inverted;
    let listed = listing_order(patterns, repeat);
    let chosen = matches_of(listed, repeat, view.len(), |pattern| {
        order
            .iter()
            .copied()
            .filter(|&i| equal(view.value(i), pattern))
            .collect()
    });
    let in_list_order = matches!(rt, ReturnType::Rank | ReturnType::ReverseRank);
    let picked = if in_list_order {
        Picked::walk(chosen)
    } else {
        Picked::set(chosen)
    };
    picked.shaped(Shape::new(Space::Rank, Extent::Set))
}

/// The items of a key or value list in the order they are answered: every
/// listing when `every`, else each distinct item at its last listing.
fn listing_order(items: &[Value], every: bool) -> Vec<&Value> {
    if every {
        return items.iter().collect();
    }
    last_occurrences(items)
        .into_iter()
        .map(|i| &items[i])
        .collect()
}

/// The indexes `matching` finds for each of `listed`, in that order; an
/// index found before is found again only with `repeat`.
fn matches_of<'v>(
    listed: Vec<&'v Value>,
    repeat: bool,
    len: usize,
    matching: impl Fn(&'v Value) -> Vec<usize>,
) -> Vec<usize> {
    let mut seen = vec![false; len];
    let mut chosen = Vec::new();
    for item in listed {
        for i in matching(item) {
            if !std::mem::replace(&mut seen[i], true) || repeat {
                chosen.push(i);
            }
        }
    }
    chosen
}

/// A value selector's matches: a set, on key-value-ordered maps too (the
/// reference, 8.1.2, lists them in key order there as well).
fn by_values(matches: Vec<usize>) -> Picked {
    Picked::set(matches)
}

/// The start and count of a range relative to `anchor` (where the key or
/// value would sort): a start before 0 moves to 0, shrinking the count.
fn relative(anchor: usize, offset: i64, count: u64) -> (i64, Option<i64>) {
    let start = len_i64(anchor).saturating_add(offset);
    if start >= 0 {
        return (start, count_i64(count));
    }
    (0, count_i64(count.saturating_sub(start.unsigned_abs())))
}

/// Indexes `[index, index + count)` (clamped), or their complement. A range
/// covering the whole map is listed as a set (stored order); a complement
/// that is one contiguous range is walked in key order.
fn index_range(
    view: &View,
    index: i64,
    count: Option<i64>,
    inverted: bool,
) -> Result<Picked, CdtError> {
    let len = view.len();
    let (start, end) = range_of(index, count, len)?;
    let shape = Shape::new(Space::Index, Extent::range(start, end))
        .whole(Whole::Always)
        .exists(range_exists(view.map.is_key_ordered(), false));
    if !inverted {
        let chosen: Vec<usize> = (start..end).collect();
        let whole = len > 0 && chosen.len() == len;
        let picked = if whole {
            Picked::set(chosen)
        } else {
            Picked::walk(chosen)
        };
        return Ok(picked.shaped(shape));
    }
    let picked = if start == end {
        Picked::set((0..len).collect())
    } else if start == 0 {
        Picked::walk((end..len).collect())
    } else if end == len {
        Picked::walk((0..start).collect())
    } else {
        Picked {
            chosen: (start..end).collect(),
            listing: Listing::Set,
            invert: true,
            shape: None,
        }
    };
    Ok(picked.shaped(shape))
}

/// Ranks `[rank, rank + count)` (clamped), in rank order, or their
/// complement: walked in rank order when contiguous, else a set.
fn rank_range(
    view: &View,
    rank: i64,
    count: Option<i64>,
    inverted: bool,
) -> Result<Picked, CdtError> {
    let len = view.len();
    let (start, end) = range_of(rank, count, len)?;
    let order = view.rank_order();
    let slice = |from: usize, to: usize| {
        order
            .get(from..to)
            .map(<[usize]>::to_vec)
            .unwrap_or_default()
    };
    let shape =
        Shape::new(Space::Rank, Extent::range(start, end)).exists(InvertedExists::OneStretch);
    if !inverted {
        return Ok(Picked::walk(slice(start, end)).shaped(shape));
    }
    let picked = if start == end {
        Picked::walk(order.clone())
    } else if start == 0 {
        Picked::walk(slice(end, len))
    } else if end == len {
        Picked::walk(slice(0, start))
    } else {
        Picked {
            chosen: slice(start, end),
            listing: Listing::Set,
            invert: true,
            shape: None,
        }
    };
    Ok(picked.shaped(shape))
}

/// Shapes the result of `picked` for `rt`; also returns the stored
/// positions of the selected entries (what a remove-by removes).
fn answer(
    view: &View,
    picked: Picked,
    rt: ReturnType,
    single: bool,
    inverted: bool,
) -> Result<(Option<Value>, Vec<usize>), CdtError> {
    let mut selection = Selection {
        keys: Some(view.keys()),
        values: view.values(),
        chosen: picked.chosen,
        single,
        shape: picked.shape,
        inverted,
        rank_ties: RankTies::ByIndex,
    };
    if picked.invert {
        selection.invert();
    }
    // An index-space choice (or its complement) lists its ranks by index.
    let by_index = picked
        .shape
        .is_some_and(|shape| shape.space == Space::Index);
    if picked.listing == Listing::Set {
        match rt {
            ReturnType::Rank | ReturnType::ReverseRank if by_index => {
                selection.chosen.sort_unstable()
            }
            ReturnType::Rank | ReturnType::ReverseRank => {
                let ranks = view.ranks();
                selection.chosen.sort_by_key(|&i| ranks[i]);
            }
            ReturnType::Key
            | ReturnType::Value
            | ReturnType::KeyValue
            | ReturnType::UnorderedMap
            | ReturnType::OrderedMap => selection.chosen.sort_by_key(|&i| view.by_key[i]),
            _ => selection.chosen.sort_unstable(),
        }
    }
    let doomed = selection.chosen.iter().map(|&i| view.by_key[i]).collect();
    // A single key or value not found answers nothing (the reference leaves
    // the result empty).
    let nothing =
        single && selection.chosen.is_empty() && matches!(rt, ReturnType::Key | ReturnType::Value);
    let result = selection.result(rt)?;
    Ok((if nothing { None } else { result }, doomed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::{List, MAP_PRESERVE_ORDER};

    const INVERTED: i64 = crate::result::INVERTED;
    // Return types.
    const RT_NONE: i64 = 0;
    const RT_INDEX: i64 = 1;
    const RT_REVERSE_INDEX: i64 = 2;
    const RT_RANK: i64 = 3;
    const RT_REVERSE_RANK: i64 = 4;
    const RT_COUNT: i64 = 5;
    const RT_KEY: i64 = 6;
    const RT_VALUE: i64 = 7;
    const RT_KEY_VALUE: i64 = 8;
    const RT_EXISTS: i64 = 13;
    const RT_UNORDERED_MAP: i64 = 16;
    const RT_ORDERED_MAP: i64 = 17;

    fn int(i: i64) -> Value {
        Value::Int(i)
    }

    fn s(text: &str) -> Value {
        Value::str(text)
    }

    fn list(items: Vec<Value>) -> Value {
        Value::List(List { flags: 0, items })
    }

    fn ints(items: &[i64]) -> Value {
        list(items.iter().map(|&i| int(i)).collect())
    }

    fn strs(items: &[&str]) -> Value {
        list(items.iter().map(|t| s(t)).collect())
    }

    fn map_of(flags: u8, entries: Vec<(Value, Value)>) -> Value {
        Value::Map(Map { flags, entries })
    }

    /// An int→int map with `flags`, entries in the given (stored) order.
    fn imap(flags: u8, pairs: &[(i64, i64)]) -> Option<Value> {
        Some(map_of(
            flags,
            pairs.iter().map(|&(k, v)| (int(k), int(v))).collect(),
        ))
    }

    /// A string→int map.
    fn smap(flags: u8, pairs: &[(&str, i64)]) -> Option<Value> {
        Some(map_of(
            flags,
            pairs.iter().map(|&(k, v)| (s(k), int(v))).collect(),
        ))
    }

    /// The scores map of the Java client's TestOperateMap (unordered).
    fn scores() -> Option<Value> {
        smap(
            0,
            &[("Charlie", 55), ("Jim", 98), ("John", 76), ("Harry", 82)],
        )
    }

    /// The map of the Java client's relative-range tests.
    fn relative_map() -> Option<Value> {
        imap(0, &[(0, 17), (4, 2), (5, 15), (9, 10)])
    }

    fn kv(pairs: Vec<(Value, Value)>) -> Value {
        map_of(MAP_PRESERVE_ORDER, pairs)
    }

    fn run(
        code: i64,
        args: Vec<Value>,
        slot: &mut Option<Value>,
    ) -> Result<Option<Value>, CdtError> {
        apply(code, &args, slot)
    }

    /// Runs an op that must succeed with a result.
    fn ok(code: i64, args: Vec<Value>, slot: &mut Option<Value>) -> Value {
        match run(code, args, slot) {
            Ok(Some(value)) => value,
            other => panic!("op {code}: {other:?}"),
        }
    }

    fn bytes(value: &Value) -> Vec<u8> {
        value::to_bytes(value)
    }

    /// Exact equality: same bytes (so flags and int/double count).
    #[track_caller]
    fn same(got: &Value, want: &Value) {
        assert_eq!(bytes(got), bytes(want), "got {got:?}, want {want:?}");
    }

    #[track_caller]
    fn slot_is(slot: &Option<Value>, want: &Option<Value>) {
        assert_eq!(
            slot.as_ref().map(bytes),
            want.as_ref().map(bytes),
            "slot {slot:?}"
        );
    }

    /// Asserts the op fails with `err` and leaves the slot as it was.
    #[track_caller]
    fn fails(code: i64, args: Vec<Value>, slot: &Option<Value>, err: CdtError) {
        let mut work = slot.clone();
        assert_eq!(run(code, args, &mut work), Err(err));
        slot_is(&work, slot);
    }

    fn entries_of(slot: &Option<Value>) -> Vec<(Value, Value)> {
        match slot {
            Some(Value::Map(map)) => map.entries.clone(),
            other => panic!("not a map: {other:?}"),
        }
    }

    fn flags_of(slot: &Option<Value>) -> u8 {
        match slot {
            Some(Value::Map(map)) => map.flags,
            other => panic!("not a map: {other:?}"),
        }
    }

    fn keys_of(slot: &Option<Value>) -> Vec<Value> {
        entries_of(slot).into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn op_codes_are_classified() {
        for code in [
            64, 65, 66, 67, 68, 69, 70, 73, 74, 75, 76, 77, 78, 79, 81, 85, 89,
        ] {
            assert_eq!(is_modify(code), Some(true), "{code}");
        }
        for code in [96, 97, 98, 99, 100, 102, 105, 110] {
            assert_eq!(is_modify(code), Some(false), "{code}");
        }
        for code in [71, 72, 80, 101, 90, 95, 111, 127, 63, 128, -1, 0, i64::MAX] {
            assert_eq!(is_modify(code), None, "{code}");
        }
        let mut slot = None;
        assert_eq!(run(71, vec![], &mut slot), Err(CdtError::Parameter));
        assert_eq!(
            run(101, vec![int(1), int(1)], &mut slot),
            Err(CdtError::Parameter)
        );
    }

    #[test]
    fn put_creates_an_unordered_map_keeping_insertion_order() {
        let mut slot = None;
        same(&ok(PUT, vec![int(11), int(789)], &mut slot), &int(1));
        same(
            &ok(PUT, vec![int(10), int(999), int(0)], &mut slot),
            &int(2),
        );
        same(
            &ok(PUT, vec![int(12), int(500), int(0), int(0)], &mut slot),
            &int(3),
        );
        // An existing key is replaced in place.
        same(&ok(PUT, vec![int(10), int(1)], &mut slot), &int(3));
        slot_is(&slot, &imap(0, &[(11, 789), (10, 1), (12, 500)]));
    }

    #[test]
    fn put_with_an_order_attribute_creates_that_order() {
        let mut slot = None;
        ok(PUT, vec![int(3), int(30), int(1)], &mut slot);
        ok(PUT, vec![int(1), int(10), int(1)], &mut slot);
        ok(PUT, vec![int(2), int(20), int(0)], &mut slot);
        // The attribute only applies at creation; inserts keep key order.
        slot_is(&slot, &imap(MAP_KEY_ORDERED, &[(1, 10), (2, 20), (3, 30)]));

        let mut slot = None;
        ok(PUT, vec![s("b"), int(1), int(3)], &mut slot);
        assert_eq!(flags_of(&slot), MAP_KEY_ORDERED | MAP_VALUE_ORDERED);
        // Persist index is accepted and not stored.
        let mut slot = None;
        ok(
            PUT_ITEMS,
            vec![map_of(0, vec![(int(1), int(1))]), int(0x11)],
            &mut slot,
        );
        assert_eq!(flags_of(&slot), MAP_KEY_ORDERED);
        // Value-ordered alone creates an unordered map.
        let mut slot = None;
        ok(PUT, vec![int(1), int(1), int(2)], &mut slot);
        assert_eq!(flags_of(&slot), 0);
    }

    #[test]
    fn put_write_flags() {
        let start = imap(0, &[(1, 10), (2, 20)]);
        // CREATE_ONLY
        fails(
            PUT,
            vec![int(1), int(11), int(0), int(0x01)],
            &start,
            CdtError::ElementExists,
        );
        let mut slot = start.clone();
        same(
            &ok(PUT, vec![int(3), int(30), int(0), int(0x01)], &mut slot),
            &int(3),
        );
        // UPDATE_ONLY
        fails(
            PUT,
            vec![int(9), int(90), int(0), int(0x02)],
            &start,
            CdtError::ElementNotFound,
        );
        let mut slot = start.clone();
        same(
            &ok(PUT, vec![int(2), int(21), int(0), int(0x02)], &mut slot),
            &int(2),
        );
        slot_is(&slot, &imap(0, &[(1, 10), (2, 21)]));
        // NO_FAIL skips silently, answering the unchanged size.
        for flags in [0x05, 0x0d] {
            let mut slot = start.clone();
            same(
                &ok(PUT, vec![int(1), int(11), int(0), int(flags)], &mut slot),
                &int(2),
            );
            slot_is(&slot, &start);
        }
        let mut slot = start.clone();
        same(
            &ok(PUT, vec![int(9), int(90), int(0), int(0x06)], &mut slot),
            &int(2),
        );
        slot_is(&slot, &start);
        // Both CREATE_ONLY and UPDATE_ONLY: nothing can be written.
        fails(
            PUT,
            vec![int(1), int(1), int(0), int(0x03)],
            &start,
            CdtError::ElementExists,
        );
        fails(
            PUT,
            vec![int(7), int(1), int(0), int(0x03)],
            &start,
            CdtError::ElementNotFound,
        );
        // UPDATE_ONLY on an absent map: error and nothing created; with
        // NO_FAIL the (empty) map is created, as the reference.
        fails(
            PUT,
            vec![int(1), int(1), int(0), int(0x02)],
            &None,
            CdtError::ElementNotFound,
        );
        let mut slot = None;
        same(
            &ok(PUT, vec![int(1), int(1), int(1), int(0x06)], &mut slot),
            &int(0),
        );
        slot_is(&slot, &imap(MAP_KEY_ORDERED, &[]));
    }

    #[test]
    fn put_items_write_flags_and_partial() {
        // The Java client's operateMapPartial.
        let start = imap(0, &[(0, 17), (4, 2), (5, 15), (9, 10)]);
        let items = map_of(0, vec![(int(3), int(3)), (int(5), int(15))]);
        let mut slot = start.clone();
        same(
            &ok(
                PUT_ITEMS,
                vec![items.clone(), int(0), int(0x01 | 0x04 | 0x08)],
                &mut slot,
            ),
            &int(5),
        );
        slot_is(
            &slot,
            &imap(0, &[(0, 17), (4, 2), (5, 15), (9, 10), (3, 3)]),
        );
        let mut slot = start.clone();
        same(
            &ok(
                PUT_ITEMS,
                vec![items.clone(), int(0), int(0x01 | 0x04)],
                &mut slot,
            ),
            &int(4),
        );
        slot_is(&slot, &start);
        fails(
            PUT_ITEMS,
            vec![items.clone(), int(0), int(0x01)],
            &start,
            CdtError::ElementExists,
        );
        // UPDATE_ONLY: the missing key 3 refuses the op, or is skipped.
        fails(
            PUT_ITEMS,
            vec![items.clone(), int(0), int(0x02)],
            &start,
            CdtError::ElementNotFound,
        );
        let mut slot = start.clone();
        same(
            &ok(
                PUT_ITEMS,
                vec![items.clone(), int(0), int(0x02 | 0x04)],
                &mut slot,
            ),
            &int(4),
        );
        slot_is(&slot, &start);
        let big = map_of(0, vec![(int(3), int(3)), (int(5), int(50))]);
        let mut slot = start.clone();
        same(
            &ok(
                PUT_ITEMS,
                vec![big, int(0), int(0x02 | 0x04 | 0x08)],
                &mut slot,
            ),
            &int(4),
        );
        // Overwritten entries of an unordered map move to the end.
        slot_is(&slot, &imap(0, &[(0, 17), (4, 2), (9, 10), (5, 50)]));
    }

    #[test]
    fn put_items_orders_new_items_by_key_and_last_duplicate_wins() {
        let mut slot = imap(0, &[(5, 5)]);
        let items = map_of(
            0,
            vec![
                (int(9), int(9)),
                (int(1), int(1)),
                (int(3), int(3)),
                (int(1), int(100)),
            ],
        );
        same(&ok(PUT_ITEMS, vec![items.clone()], &mut slot), &int(4));
        slot_is(&slot, &imap(0, &[(5, 5), (1, 100), (3, 3), (9, 9)]));

        let mut slot = imap(MAP_KEY_ORDERED, &[(5, 5)]);
        same(&ok(PUT_ITEMS, vec![items], &mut slot), &int(4));
        slot_is(
            &slot,
            &imap(MAP_KEY_ORDERED, &[(1, 100), (3, 3), (5, 5), (9, 9)]),
        );

        // Empty items: no change, the size; an absent map is created.
        let mut slot = imap(0, &[(5, 5)]);
        same(&ok(PUT_ITEMS, vec![map_of(0, vec![])], &mut slot), &int(1));
        let mut slot = None;
        same(
            &ok(PUT_ITEMS, vec![map_of(0, vec![]), int(1)], &mut slot),
            &int(0),
        );
        slot_is(&slot, &imap(MAP_KEY_ORDERED, &[]));
        // Items must be a map.
        fails(PUT_ITEMS, vec![ints(&[1, 2])], &None, CdtError::Parameter);
    }

    #[test]
    fn legacy_add_and_replace() {
        let start = imap(0, &[(1, 10)]);
        let mut slot = start.clone();
        same(&ok(ADD, vec![int(2), int(20)], &mut slot), &int(2));
        fails(ADD, vec![int(1), int(11)], &start, CdtError::ElementExists);
        same(&ok(REPLACE, vec![int(1), int(11)], &mut slot), &int(2));
        fails(
            REPLACE,
            vec![int(3), int(30)],
            &start,
            CdtError::ElementNotFound,
        );
        slot_is(&slot, &imap(0, &[(1, 11), (2, 20)]));
        // REPLACE and REPLACE_ITEMS cannot create.
        fails(
            REPLACE,
            vec![int(1), int(1)],
            &None,
            CdtError::ElementNotFound,
        );
        fails(
            REPLACE_ITEMS,
            vec![map_of(0, vec![])],
            &None,
            CdtError::ElementNotFound,
        );
        // ADD creates with its attribute.
        let mut slot = None;
        same(&ok(ADD, vec![int(2), int(2), int(1)], &mut slot), &int(1));
        assert_eq!(flags_of(&slot), MAP_KEY_ORDERED);

        let items = map_of(0, vec![(int(1), int(100)), (int(2), int(200))]);
        let mut slot = start.clone();
        fails(
            ADD_ITEMS,
            vec![items.clone()],
            &start,
            CdtError::ElementExists,
        );
        fails(
            REPLACE_ITEMS,
            vec![items.clone()],
            &start,
            CdtError::ElementNotFound,
        );
        same(
            &ok(
                ADD_ITEMS,
                vec![map_of(0, vec![(int(2), int(2))]), int(1)],
                &mut slot,
            ),
            &int(2),
        );
        same(&ok(REPLACE_ITEMS, vec![items], &mut slot), &int(2));
        slot_is(&slot, &imap(0, &[(1, 100), (2, 200)]));
    }

    #[test]
    fn keys_must_be_scalars_and_values_storable() {
        let start = imap(0, &[(1, 1)]);
        fails(PUT, vec![ints(&[1]), int(1)], &start, CdtError::Parameter);
        fails(
            PUT,
            vec![map_of(0, vec![]), int(1)],
            &start,
            CdtError::Parameter,
        );
        fails(
            PUT,
            vec![Value::Wildcard, int(1)],
            &start,
            CdtError::Parameter,
        );
        fails(
            PUT,
            vec![int(2), Value::Infinity],
            &start,
            CdtError::Parameter,
        );
        fails(
            PUT,
            vec![int(2), list(vec![int(1), Value::Wildcard])],
            &start,
            CdtError::Parameter,
        );
        let bad_items = map_of(0, vec![(int(2), int(2)), (ints(&[3]), int(3))]);
        fails(PUT_ITEMS, vec![bad_items], &start, CdtError::Parameter);
        // An ext key (found by the exp_parse_eval fuzz target: stored first
        // it read back as the flags header).
        for key in [Value::Ext(1, vec![0x23]), Value::Ext(7, vec![1, 2])] {
            fails(
                PUT,
                vec![key.clone(), Value::Nil],
                &None,
                CdtError::Parameter,
            );
            fails(ADD, vec![key.clone(), int(1)], &start, CdtError::Parameter);
            let items = map_of(0, vec![(key, int(1))]);
            fails(PUT_ITEMS, vec![items], &start, CdtError::Parameter);
        }
        fails(
            INCREMENT,
            vec![ints(&[1]), int(1)],
            &start,
            CdtError::Parameter,
        );
        // Bad keys are refused even when NO_FAIL would skip.
        fails(
            PUT,
            vec![ints(&[1]), int(1), int(0), int(0x04)],
            &None,
            CdtError::Parameter,
        );
        // Scalars of every kind are keys; collections are values.
        let mut slot = None;
        for key in [
            s("a"),
            Value::Double(1.5),
            Value::Blob(4, vec![1]),
            int(-3),
            Value::Bool(true),
        ] {
            ok(PUT, vec![key, ints(&[1, 2]), int(1)], &mut slot);
        }
        // Int 1 and double 1.0 are different keys.
        ok(PUT, vec![int(1), int(0)], &mut slot);
        same(
            &ok(PUT, vec![Value::Double(1.0), int(0)], &mut slot),
            &int(7),
        );
        let keys = keys_of(&slot);
        assert!(keys
            .windows(2)
            .all(|w| value::compare(&w[0], &w[1]) == Ordering::Less));
    }

    #[test]
    fn increment_and_decrement() {
        let mut slot = None;
        // A missing key starts from 0; the attribute creates the order.
        same(
            &ok(INCREMENT, vec![s("b"), int(5), int(1)], &mut slot),
            &int(5),
        );
        same(&ok(INCREMENT, vec![s("a"), int(-2)], &mut slot), &int(-2));
        assert_eq!(flags_of(&slot), MAP_KEY_ORDERED);
        assert_eq!(keys_of(&slot), vec![s("a"), s("b")]);
        same(&ok(INCREMENT, vec![s("b"), int(3)], &mut slot), &int(8));
        // Missing or nil delta: 1.
        same(&ok(INCREMENT, vec![s("b")], &mut slot), &int(9));
        same(
            &ok(INCREMENT, vec![s("b"), Value::Nil], &mut slot),
            &int(10),
        );
        same(&ok(DECREMENT, vec![s("b")], &mut slot), &int(9));
        same(&ok(DECREMENT, vec![s("b"), int(4)], &mut slot), &int(5));
        // An integer stays an integer (double delta truncated).
        same(
            &ok(INCREMENT, vec![s("b"), Value::Double(2.9)], &mut slot),
            &int(7),
        );
        same(
            &ok(DECREMENT, vec![s("b"), Value::Double(1.5)], &mut slot),
            &int(6),
        );
        // A double stays a double; a missing key takes the delta's type.
        same(
            &ok(INCREMENT, vec![s("d"), Value::Double(0.5)], &mut slot),
            &Value::Double(0.5),
        );
        same(
            &ok(INCREMENT, vec![s("d"), int(2)], &mut slot),
            &Value::Double(2.5),
        );
        same(
            &ok(DECREMENT, vec![s("d"), Value::Double(0.25)], &mut slot),
            &Value::Double(2.25),
        );
        // Overflow wraps as the reference's 64-bit add.
        let mut big = smap(0, &[("x", i64::MAX)]);
        same(
            &ok(INCREMENT, vec![s("x"), int(1)], &mut big),
            &int(i64::MIN),
        );
        // Non-numbers are refused: the value, or the delta.
        let text = Some(map_of(0, vec![(s("t"), s("text"))]));
        fails(INCREMENT, vec![s("t"), int(1)], &text, CdtError::Parameter);
        fails(INCREMENT, vec![s("t"), s("1")], &slot, CdtError::Parameter);
        fails(
            INCREMENT,
            vec![s("b"), ints(&[1])],
            &slot,
            CdtError::Parameter,
        );
        fails(INCREMENT, vec![], &slot, CdtError::Parameter);
        fails(
            INCREMENT,
            vec![s("b"), int(1), int(0), int(0)],
            &slot,
            CdtError::Parameter,
        );
    }

    #[test]
    fn set_type_reorders() {
        let mut slot = imap(0, &[(3, 30), (1, 10), (2, 20)]);
        assert_eq!(run(SET_TYPE, vec![int(1)], &mut slot), Ok(None));
        slot_is(&slot, &imap(MAP_KEY_ORDERED, &[(1, 10), (2, 20), (3, 30)]));
        assert_eq!(run(SET_TYPE, vec![int(3)], &mut slot), Ok(None));
        assert_eq!(flags_of(&slot), MAP_KEY_ORDERED | MAP_VALUE_ORDERED);
        // Back to unordered keeps the entries where they are.
        assert_eq!(run(SET_TYPE, vec![int(0)], &mut slot), Ok(None));
        slot_is(&slot, &imap(0, &[(1, 10), (2, 20), (3, 30)]));
        // Value-ordered without key-ordered is refused.
        fails(SET_TYPE, vec![int(2)], &slot, CdtError::OpNotApplicable);
        fails(SET_TYPE, vec![int(-1)], &slot, CdtError::Parameter);
        fails(SET_TYPE, vec![], &slot, CdtError::Parameter);
        fails(SET_TYPE, vec![int(1), int(1)], &slot, CdtError::Parameter);
        // An absent map is created.
        let mut slot = None;
        assert_eq!(run(SET_TYPE, vec![int(0x11)], &mut slot), Ok(None));
        slot_is(&slot, &imap(MAP_KEY_ORDERED, &[]));
    }

    #[test]
    fn clear_and_size() {
        let mut slot = imap(MAP_KEY_ORDERED, &[(1, 1), (2, 2)]);
        same(&ok(SIZE, vec![], &mut slot), &int(2));
        assert_eq!(run(CLEAR, vec![], &mut slot), Ok(None));
        slot_is(&slot, &imap(MAP_KEY_ORDERED, &[]));
        same(&ok(SIZE, vec![], &mut slot), &int(0));
        // Absent: nothing to clear or count, nothing created.
        let mut slot = None;
        assert_eq!(run(CLEAR, vec![], &mut slot), Ok(None));
        assert_eq!(run(SIZE, vec![], &mut slot), Ok(None));
        assert!(slot.is_none());
    }

    #[test]
    fn get_by_key_every_return_type() {
        let mut slot = scores();
        let by_key =
            |rt: i64, slot: &mut Option<Value>| ok(GET_BY_KEY, vec![int(rt), s("John")], slot);
        // Key order: Charlie, Harry, Jim, John; values 55, 82, 98, 76.
        same(&by_key(RT_INDEX, &mut slot), &int(3));
        same(&by_key(RT_REVERSE_INDEX, &mut slot), &int(0));
        same(&by_key(RT_RANK, &mut slot), &int(1));
        same(&by_key(RT_REVERSE_RANK, &mut slot), &int(2));
        same(&by_key(RT_COUNT, &mut slot), &int(1));
        same(&by_key(RT_KEY, &mut slot), &s("John"));
        same(&by_key(RT_VALUE, &mut slot), &int(76));
        same(&by_key(RT_EXISTS, &mut slot), &Value::Bool(true));
        same(
            &by_key(RT_KEY_VALUE, &mut slot),
            &kv(vec![(s("John"), int(76))]),
        );
        same(
            &by_key(RT_UNORDERED_MAP, &mut slot),
            &map_of(0, vec![(s("John"), int(76))]),
        );
        same(
            &by_key(RT_ORDERED_MAP, &mut slot),
            &map_of(MAP_KEY_ORDERED, vec![(s("John"), int(76))]),
        );
        assert_eq!(
            run(GET_BY_KEY, vec![int(RT_NONE), s("John")], &mut slot),
            Ok(None)
        );
        slot_is(&slot, &scores());
    }

    #[test]
    fn get_by_key_not_found() {
        let mut slot = scores();
        let missing =
            |rt: i64, slot: &mut Option<Value>| run(GET_BY_KEY, vec![int(rt), s("Zed")], slot);
        let found =
            |rt: i64, slot: &mut Option<Value>| ok(GET_BY_KEY, vec![int(rt), s("Zed")], slot);
        assert_eq!(missing(RT_VALUE, &mut slot), Ok(None));
        assert_eq!(missing(RT_KEY, &mut slot), Ok(None));
        same(&found(RT_INDEX, &mut slot), &int(-1));
        same(&found(RT_RANK, &mut slot), &int(-1));
        same(&found(RT_COUNT, &mut slot), &int(0));
        same(&found(RT_EXISTS, &mut slot), &Value::Bool(false));
        same(&found(RT_KEY_VALUE, &mut slot), &kv(vec![]));
        // Single-element ops refuse INVERTED.
        fails(
            GET_BY_KEY,
            vec![int(RT_KEY | INVERTED), s("Jim")],
            &slot,
            CdtError::OpNotApplicable,
        );
        fails(
            REMOVE_BY_INDEX,
            vec![int(RT_KEY | INVERTED), int(0)],
            &slot,
            CdtError::OpNotApplicable,
        );
    }

    #[test]
    fn index_uses_key_order_on_unordered_maps() {
        // The Java client's operateMapSwitch: puts 4, 3, 2, 1 unordered.
        let mut slot = imap(0, &[(4, 4), (3, 3), (2, 2), (1, 1)]);
        same(
            &ok(GET_BY_INDEX, vec![int(RT_KEY_VALUE), int(2)], &mut slot),
            &kv(vec![(int(3), int(3))]),
        );
        same(
            &ok(GET_BY_INDEX, vec![int(RT_KEY), int(0)], &mut slot),
            &int(1),
        );
        same(
            &ok(GET_BY_INDEX, vec![int(RT_KEY), int(-1)], &mut slot),
            &int(4),
        );
        same(
            &ok(GET_BY_INDEX, vec![int(RT_KEY), int(-4)], &mut slot),
            &int(1),
        );
        same(
            &ok(
                GET_BY_INDEX,
                vec![int(RT_REVERSE_INDEX), int(-4)],
                &mut slot,
            ),
            &int(3),
        );
        // A single index out of range is not applicable.
        for index in [4, -5, i64::MAX, i64::MIN] {
            fails(
                GET_BY_INDEX,
                vec![int(RT_KEY), int(index)],
                &slot,
                CdtError::OpNotApplicable,
            );
            fails(
                REMOVE_BY_INDEX,
                vec![int(RT_KEY), int(index)],
                &slot,
                CdtError::OpNotApplicable,
            );
            fails(
                GET_BY_RANK,
                vec![int(RT_KEY), int(index)],
                &slot,
                CdtError::OpNotApplicable,
            );
        }
        fails(
            GET_BY_INDEX,
            vec![int(RT_KEY), int(0)],
            &imap(0, &[]),
            CdtError::OpNotApplicable,
        );
        // Key-ordered maps store what the index sees.
        let mut sorted = imap(MAP_KEY_ORDERED, &[(1, 1), (2, 2), (3, 3), (4, 4)]);
        same(
            &ok(GET_BY_INDEX, vec![int(RT_VALUE), int(1)], &mut sorted),
            &int(2),
        );
    }

    #[test]
    fn index_range_clamps_and_lists_in_key_order() {
        let mut slot = imap(0, &[(4, 40), (3, 30), (2, 20), (1, 10), (5, 50)]);
        let range = |args: Vec<Value>, slot: &mut Option<Value>| ok(GET_BY_INDEX_RANGE, args, slot);
        same(
            &range(vec![int(RT_KEY), int(1), int(2)], &mut slot),
            &ints(&[2, 3]),
        );
        same(
            &range(vec![int(RT_KEY), int(-2)], &mut slot),
            &ints(&[4, 5]),
        );
        same(
            &range(vec![int(RT_KEY), int(3), int(100)], &mut slot),
            &ints(&[4, 5]),
        );
        // A start before the first element shrinks the count.
        same(
            &range(vec![int(RT_KEY), int(-7), int(3)], &mut slot),
            &ints(&[1]),
        );
        same(
            &range(vec![int(RT_KEY), int(-7), int(2)], &mut slot),
            &ints(&[]),
        );
        same(&range(vec![int(RT_KEY), int(5)], &mut slot), &ints(&[]));
        same(
            &range(vec![int(RT_KEY), int(i64::MAX), int(1)], &mut slot),
            &ints(&[]),
        );
        // The default count is the reference's (2^32 - 1): a start that far
        // before the first element selects nothing. (-7 gives the whole
        // map, listed in stored order as explained below.)
        same(
            &range(vec![int(RT_KEY), int(-7)], &mut slot),
            &ints(&[4, 3, 2, 1, 5]),
        );
        same(
            &range(vec![int(RT_KEY), int(i64::MIN)], &mut slot),
            &ints(&[]),
        );
        same(
            &range(vec![int(RT_INDEX), int(1), int(2)], &mut slot),
            &ints(&[1, 2]),
        );
        // Reverse indexes of an index range ascend (the reference's).
        same(
            &range(vec![int(RT_REVERSE_INDEX), int(1), int(2)], &mut slot),
            &ints(&[2, 3]),
        );
        same(
            &range(vec![int(RT_COUNT), int(1), int(2)], &mut slot),
            &int(2),
        );
        same(
            &range(vec![int(RT_VALUE), int(0), int(2)], &mut slot),
            &ints(&[10, 20]),
        );
        same(
            &range(vec![int(RT_KEY_VALUE), int(3)], &mut slot),
            &kv(vec![(int(4), int(40)), (int(5), int(50))]),
        );
        // The whole map is listed in stored order, as the reference.
        same(
            &range(vec![int(RT_KEY), int(0)], &mut slot),
            &ints(&[4, 3, 2, 1, 5]),
        );
        same(
            &range(vec![int(RT_INDEX), int(0)], &mut slot),
            &ints(&[0, 1, 2, 3, 4]),
        );
        // A negative count is a huge unsigned one on the wire: to the end.
        same(
            &range(vec![int(RT_KEY), int(0), int(-1)], &mut slot),
            &ints(&[4, 3, 2, 1, 5]),
        );
    }

    #[test]
    fn rank_order_breaks_ties_by_key() {
        let mut slot = smap(0, &[("d", 2), ("b", 1), ("a", 2), ("c", 0)]);
        same(
            &ok(GET_BY_RANK_RANGE, vec![int(RT_KEY), int(0)], &mut slot),
            &strs(&["c", "b", "a", "d"]),
        );
        same(
            &ok(GET_BY_RANK, vec![int(RT_KEY), int(-1)], &mut slot),
            &s("d"),
        );
        same(
            &ok(GET_BY_RANK, vec![int(RT_KEY), int(2)], &mut slot),
            &s("a"),
        );
        same(
            &ok(GET_BY_RANK, vec![int(RT_INDEX), int(0)], &mut slot),
            &int(2),
        );
        same(
            &ok(GET_BY_RANK, vec![int(RT_REVERSE_RANK), int(0)], &mut slot),
            &int(3),
        );
        same(
            &ok(
                GET_BY_RANK_RANGE,
                vec![int(RT_INDEX), int(-3), int(2)],
                &mut slot,
            ),
            &ints(&[1, 0]),
        );
        same(
            &ok(
                GET_BY_RANK_RANGE,
                vec![int(RT_RANK), int(1), int(9)],
                &mut slot,
            ),
            &ints(&[1, 2, 3]),
        );
        // Reverse ranks of a rank range ascend (the reference's).
        same(
            &ok(
                GET_BY_RANK_RANGE,
                vec![int(RT_REVERSE_RANK), int(1), int(2)],
                &mut slot,
            ),
            &ints(&[1, 2]),
        );
        same(
            &ok(
                GET_BY_RANK_RANGE,
                vec![int(RT_KEY_VALUE), int(-2)],
                &mut slot,
            ),
            &kv(vec![(s("a"), int(2)), (s("d"), int(2))]),
        );
        same(
            &ok(
                GET_BY_RANK_RANGE,
                vec![int(RT_KEY), int(-9), int(6)],
                &mut slot,
            ),
            &strs(&["c"]),
        );
    }

    #[test]
    fn java_rank_scenario() {
        // The Java client's operateMapRank after its increments.
        let mut slot = smap(
            0,
            &[("Charlie", 55), ("Jim", 94), ("John", 81), ("Harry", 82)],
        );
        let mut get = |code: i64, args: Vec<Value>| ok(code, args, &mut slot);
        same(
            &get(GET_BY_RANK_RANGE, vec![int(RT_KEY), int(-2), int(2)]),
            &strs(&["Harry", "Jim"]),
        );
        same(
            &get(GET_BY_RANK_RANGE, vec![int(RT_KEY_VALUE), int(0), int(2)]),
            &kv(vec![(s("Charlie"), int(55)), (s("John"), int(81))]),
        );
        same(&get(GET_BY_RANK, vec![int(RT_VALUE), int(0)]), &int(55));
        same(&get(GET_BY_RANK, vec![int(RT_KEY), int(2)]), &s("Harry"));
        same(
            &get(GET_BY_VALUE_INTERVAL, vec![int(RT_RANK), int(90), int(95)]),
            &ints(&[3]),
        );
        same(
            &get(GET_BY_VALUE_INTERVAL, vec![int(RT_COUNT), int(90), int(95)]),
            &int(1),
        );
        same(
            &get(
                GET_BY_VALUE_INTERVAL,
                vec![int(RT_KEY_VALUE), int(90), int(95)],
            ),
            &kv(vec![(s("Jim"), int(94))]),
        );
        same(
            &get(GET_BY_VALUE_INTERVAL, vec![int(RT_KEY), int(81), int(82)]),
            &strs(&["John"]),
        );
        same(
            &get(GET_ALL_BY_VALUE, vec![int(RT_KEY), int(77)]),
            &strs(&[]),
        );
        same(
            &get(GET_ALL_BY_VALUE, vec![int(RT_RANK), int(81)]),
            &ints(&[1]),
        );
        same(&get(GET_BY_KEY, vec![int(RT_RANK), s("Charlie")]), &int(0));
        same(
            &get(GET_BY_KEY, vec![int(RT_REVERSE_RANK), s("Charlie")]),
            &int(3),
        );
    }

    #[test]
    fn value_interval_bounds() {
        let mut slot = smap(0, &[("e", 5), ("a", 1), ("c", 3), ("b", 2), ("d", 4)]);
        let mut get = |args: Vec<Value>| ok(GET_BY_VALUE_INTERVAL, args, &mut slot);
        // Nil begins below everything; a missing end is unbounded.
        same(&get(vec![int(RT_COUNT), Value::Nil]), &int(5));
        same(&get(vec![int(RT_COUNT), Value::Nil, int(3)]), &int(2));
        same(&get(vec![int(RT_COUNT), int(3)]), &int(3));
        same(&get(vec![int(RT_COUNT), int(3), Value::Infinity]), &int(3));
        same(&get(vec![int(RT_COUNT), int(4), int(2)]), &int(0));
        // An explicit nil end is an end below everything.
        same(&get(vec![int(RT_COUNT), int(1), Value::Nil]), &int(0));
        // Other types sort apart: strings above integers.
        same(&get(vec![int(RT_COUNT), s("")]), &int(0));
        // Elements of a set come in stored order, ranks and indexes ascending.
        same(
            &get(vec![int(RT_KEY), int(2), int(5)]),
            &strs(&["c", "b", "d"]),
        );
        same(&get(vec![int(RT_RANK), int(2), int(5)]), &ints(&[1, 2, 3]));
        same(&get(vec![int(RT_INDEX), int(2), int(5)]), &ints(&[1, 2, 3]));
        same(
            &get(vec![int(RT_REVERSE_INDEX), int(2), int(5)]),
            &ints(&[3, 2, 1]),
        );
        // Key-value-ordered maps list value selections in key order too
        // (the reference, 8.1.2), and their indexes ascending.
        let mut kvo = Some(map_of(
            MAP_KEY_ORDERED | MAP_VALUE_ORDERED,
            vec![(s("a"), int(3)), (s("b"), int(1)), (s("c"), int(2))],
        ));
        same(
            &ok(GET_BY_VALUE_INTERVAL, vec![int(RT_KEY), int(1)], &mut kvo),
            &strs(&["a", "b", "c"]),
        );
        same(
            &ok(
                GET_BY_VALUE_LIST,
                vec![int(RT_INDEX), list(vec![int(2), int(1)])],
                &mut kvo,
            ),
            &ints(&[1, 2]),
        );
    }

    #[test]
    fn key_interval() {
        let mut sorted = imap(MAP_KEY_ORDERED, &[(0, 17), (4, 2), (5, 15), (9, 10)]);
        same(
            &ok(
                GET_BY_KEY_INTERVAL,
                vec![int(RT_KEY), int(5), Value::Infinity],
                &mut sorted,
            ),
            &ints(&[5, 9]),
        );
        same(
            &ok(
                GET_BY_KEY_INTERVAL,
                vec![int(RT_VALUE), int(1), int(9)],
                &mut sorted,
            ),
            &ints(&[2, 15]),
        );
        same(
            &ok(
                GET_BY_KEY_INTERVAL,
                vec![int(RT_INDEX), Value::Nil, int(5)],
                &mut sorted,
            ),
            &ints(&[0, 1]),
        );
        let mut unordered = imap(0, &[(9, 10), (0, 17), (5, 15), (4, 2)]);
        same(
            &ok(
                GET_BY_KEY_INTERVAL,
                vec![int(RT_KEY), int(4)],
                &mut unordered,
            ),
            &ints(&[9, 5, 4]),
        );
        same(
            &ok(
                GET_BY_KEY_INTERVAL,
                vec![int(RT_INDEX), int(4)],
                &mut unordered,
            ),
            &ints(&[1, 2, 3]),
        );
        // Ranks of a key selection come by index (the reference's).
        same(
            &ok(
                GET_BY_KEY_INTERVAL,
                vec![int(RT_RANK), int(4)],
                &mut unordered,
            ),
            &ints(&[0, 2, 1]),
        );
    }

    #[test]
    fn single_and_all_by_value() {
        let mut slot = smap(0, &[("z", 1), ("a", 1), ("m", 2)]);
        // One element: the first stored.
        same(
            &ok(GET_BY_VALUE, vec![int(RT_KEY), int(1)], &mut slot),
            &s("z"),
        );
        assert_eq!(
            run(GET_BY_VALUE, vec![int(RT_KEY), int(7)], &mut slot),
            Ok(None)
        );
        same(
            &ok(GET_BY_VALUE, vec![int(RT_INDEX), int(7)], &mut slot),
            &int(-1),
        );
        same(
            &ok(GET_ALL_BY_VALUE, vec![int(RT_KEY), int(1)], &mut slot),
            &strs(&["z", "a"]),
        );
        same(
            &ok(GET_ALL_BY_VALUE, vec![int(RT_INDEX), int(1)], &mut slot),
            &ints(&[0, 2]),
        );
        // Key-value-ordered: the lowest rank (ties by key).
        let mut kvo = smap(
            MAP_KEY_ORDERED | MAP_VALUE_ORDERED,
            &[("a", 1), ("m", 2), ("z", 1)],
        );
        same(
            &ok(GET_BY_VALUE, vec![int(RT_KEY), int(1)], &mut kvo),
            &s("a"),
        );
        // Wildcards match inside lists (the Java client's operateMapWildcard).
        let mut people = Some(map_of(
            0,
            vec![
                (int(4), list(vec![s("John"), int(55)])),
                (int(5), list(vec![s("Jim"), int(95)])),
                (int(9), list(vec![s("Joe"), int(80)])),
            ],
        ));
        let pattern = list(vec![s("Joe"), Value::Wildcard]);
        same(
            &ok(GET_ALL_BY_VALUE, vec![int(RT_KEY), pattern], &mut people),
            &ints(&[9]),
        );
    }

    #[test]
    fn key_and_value_lists() {
        // The Java client's operateMapGetByList.
        let mut slot = scores();
        same(
            &ok(
                GET_BY_KEY_LIST,
                vec![int(RT_KEY_VALUE), strs(&["Harry", "Jim"])],
                &mut slot,
            ),
            &kv(vec![(s("Jim"), int(98)), (s("Harry"), int(82))]),
        );
        same(
            &ok(
                GET_BY_VALUE_LIST,
                vec![int(RT_KEY_VALUE), ints(&[76, 50])],
                &mut slot,
            ),
            &kv(vec![(s("John"), int(76))]),
        );
        // Missing keys are skipped; indexes come in list order, a key
        // listed again at its last listing (this map is unordered).
        same(
            &ok(
                GET_BY_KEY_LIST,
                vec![int(RT_INDEX), strs(&["John", "Nobody", "Charlie", "John"])],
                &mut slot,
            ),
            &ints(&[0, 3]),
        );
        same(
            &ok(
                GET_BY_KEY_LIST,
                vec![int(RT_INDEX), strs(&["John", "Nobody", "Charlie"])],
                &mut slot,
            ),
            &ints(&[3, 0]),
        );
        same(
            &ok(GET_BY_KEY_LIST, vec![int(RT_COUNT), strs(&[])], &mut slot),
            &int(0),
        );
        // Ranks of a key list are not supported by the reference.
        fails(
            GET_BY_KEY_LIST,
            vec![int(RT_RANK), strs(&["Jim"])],
            &slot,
            CdtError::OpNotApplicable,
        );
        // Value lists answer ranks in list order.
        same(
            &ok(
                GET_BY_VALUE_LIST,
                vec![int(RT_RANK), ints(&[98, 55, 82])],
                &mut slot,
            ),
            &ints(&[3, 0, 2]),
        );
        same(
            &ok(
                GET_BY_VALUE_LIST,
                vec![int(RT_INDEX), ints(&[98, 55, 82])],
                &mut slot,
            ),
            &ints(&[0, 1, 2]),
        );
        fails(
            GET_BY_KEY_LIST,
            vec![int(RT_KEY), s("Jim")],
            &slot,
            CdtError::Parameter,
        );
        fails(
            GET_BY_VALUE_LIST,
            vec![int(RT_KEY), int(98)],
            &slot,
            CdtError::Parameter,
        );
    }

    #[test]
    fn relative_ranges_match_the_java_client() {
        let mut slot = relative_map();
        let mut keys = |key: i64, index: i64, count: Option<i64>| {
            let mut args = vec![int(RT_KEY), int(key), int(index)];
            args.extend(count.map(int));
            ok(GET_BY_KEY_REL_INDEX_RANGE, args, &mut slot)
        };
        same(&keys(5, 0, None), &ints(&[5, 9]));
        same(&keys(5, 1, None), &ints(&[9]));
        same(&keys(5, -1, None), &ints(&[4, 5, 9]));
        same(&keys(3, 2, None), &ints(&[9]));
        same(&keys(3, -2, None), &ints(&[0, 4, 5, 9]));
        same(&keys(5, 0, Some(1)), &ints(&[5]));
        same(&keys(5, 1, Some(2)), &ints(&[9]));
        same(&keys(5, -1, Some(1)), &ints(&[4]));
        same(&keys(3, 2, Some(1)), &ints(&[9]));
        same(&keys(3, -2, Some(2)), &ints(&[0]));
        same(&keys(3, -9, Some(2)), &ints(&[]));
        let mut slot = relative_map();
        let mut values = |value: i64, rank: i64, count: Option<i64>| {
            let mut args = vec![int(RT_VALUE), int(value), int(rank)];
            args.extend(count.map(int));
            ok(GET_BY_VALUE_REL_RANK_RANGE, args, &mut slot)
        };
        same(&values(11, 1, None), &ints(&[17]));
        same(&values(11, -1, None), &ints(&[10, 15, 17]));
        same(&values(11, 1, Some(1)), &ints(&[17]));
        same(&values(11, -1, Some(1)), &ints(&[10]));
        fails(
            GET_BY_KEY_REL_INDEX_RANGE,
            vec![int(RT_KEY), int(5)],
            &relative_map(),
            CdtError::Parameter,
        );
    }

    #[test]
    fn relative_removes_match_the_java_client() {
        let mut slot = relative_map();
        let mut remove = |args: Vec<Value>| ok(REMOVE_BY_KEY_REL_INDEX_RANGE, args, &mut slot);
        same(
            &remove(vec![int(RT_VALUE), int(5), int(0)]),
            &ints(&[15, 10]),
        );
        same(&remove(vec![int(RT_VALUE), int(5), int(1)]), &ints(&[]));
        same(
            &remove(vec![int(RT_VALUE), int(5), int(-1), int(1)]),
            &ints(&[2]),
        );
        slot_is(&slot, &imap(0, &[(0, 17)]));
        let mut slot = relative_map();
        same(
            &ok(
                REMOVE_BY_VALUE_REL_RANK_RANGE,
                vec![int(RT_VALUE), int(11), int(1)],
                &mut slot,
            ),
            &ints(&[17]),
        );
        same(
            &ok(
                REMOVE_BY_VALUE_REL_RANK_RANGE,
                vec![int(RT_VALUE), int(11), int(-1), int(1)],
                &mut slot,
            ),
            &ints(&[10]),
        );
        slot_is(&slot, &imap(0, &[(4, 2), (5, 15)]));
    }

    #[test]
    fn inverted_selections_match_the_java_client() {
        // The Java client's operateMapInverted.
        let mut slot = scores();
        let mut get = |code: i64, args: Vec<Value>| ok(code, args, &mut slot);
        let inv = |rt: i64| int(rt | INVERTED);
        same(
            &get(GET_ALL_BY_VALUE, vec![inv(RT_RANK), int(81)]),
            &ints(&[0, 1, 2, 3]),
        );
        same(
            &get(GET_ALL_BY_VALUE, vec![inv(RT_RANK), int(82)]),
            &ints(&[0, 1, 3]),
        );
        same(
            &get(GET_BY_VALUE_INTERVAL, vec![inv(RT_RANK), int(90), int(95)]),
            &ints(&[0, 1, 2, 3]),
        );
        same(
            &get(GET_BY_VALUE_INTERVAL, vec![inv(RT_RANK), int(90), int(100)]),
            &ints(&[0, 1, 2]),
        );
        same(
            &get(
                GET_BY_VALUE_LIST,
                vec![inv(RT_KEY_VALUE), ints(&[76, 55, 98, 50])],
            ),
            &kv(vec![(s("Harry"), int(82))]),
        );
        same(
            &get(GET_BY_RANK_RANGE, vec![inv(RT_KEY), int(-2), int(2)]),
            &strs(&["Charlie", "John"]),
        );
        same(
            &get(GET_BY_RANK_RANGE, vec![inv(RT_KEY_VALUE), int(0), int(3)]),
            &kv(vec![(s("Jim"), int(98))]),
        );
        // Complements that are not one range come as a set.
        same(
            &get(GET_BY_INDEX_RANGE, vec![inv(RT_KEY), int(1), int(2)]),
            &strs(&["Charlie", "John"]),
        );
        same(
            &get(GET_BY_INDEX_RANGE, vec![inv(RT_RANK), int(1), int(2)]),
            &ints(&[0, 1]),
        );
        same(
            &get(GET_BY_RANK_RANGE, vec![inv(RT_KEY), int(1), int(2)]),
            &strs(&["Charlie", "Jim"]),
        );
        same(
            &get(GET_BY_INDEX_RANGE, vec![inv(RT_COUNT), int(1), int(2)]),
            &int(2),
        );
        same(
            &get(GET_BY_INDEX_RANGE, vec![inv(RT_COUNT), int(9)]),
            &int(4),
        );
        same(
            &get(GET_BY_KEY_INTERVAL, vec![inv(RT_EXISTS), Value::Nil]),
            &Value::Bool(false),
        );
        same(
            &get(GET_BY_KEY_LIST, vec![inv(RT_KEY), strs(&["Jim", "Nobody"])]),
            &strs(&["Charlie", "John", "Harry"]),
        );
        same(
            &get(GET_BY_KEY_INTERVAL, vec![inv(RT_INDEX), s("H"), s("J")]),
            &ints(&[0, 2, 3]),
        );
    }

    #[test]
    fn python_inverted_removes() {
        // The Python client's test_map_* inverted cases on {a:5 .. e:1}.
        let start = smap(0, &[("a", 5), ("b", 4), ("c", 3), ("d", 2), ("e", 1)]);
        let inv = |rt: i64| int(rt | INVERTED);
        let mut slot = start.clone();
        same(
            &ok(
                REMOVE_BY_KEY_LIST,
                vec![inv(RT_VALUE), strs(&["a", "b", "c"])],
                &mut slot,
            ),
            &ints(&[2, 1]),
        );
        assert_eq!(keys_of(&slot), vec![s("a"), s("b"), s("c")]);
        let mut slot = start.clone();
        same(
            &ok(
                REMOVE_BY_VALUE_INTERVAL,
                vec![inv(RT_KEY), int(1), int(4)],
                &mut slot,
            ),
            &strs(&["a", "b"]),
        );
        assert_eq!(keys_of(&slot), vec![s("c"), s("d"), s("e")]);
        let mut slot = start.clone();
        same(
            &ok(
                REMOVE_BY_RANK_RANGE,
                vec![inv(RT_KEY), int(1), int(3)],
                &mut slot,
            ),
            &strs(&["a", "e"]),
        );
        assert_eq!(keys_of(&slot), vec![s("b"), s("c"), s("d")]);
        let mut slot = start.clone();
        same(
            &ok(REMOVE_ALL_BY_VALUE, vec![inv(RT_COUNT), int(5)], &mut slot),
            &int(4),
        );
        assert_eq!(keys_of(&slot), vec![s("a")]);
    }

    #[test]
    fn removes_by_key_index_value_rank() {
        // The Java client's operateMapRemove.
        let mut slot = smap(
            0,
            &[
                ("Charlie", 55),
                ("Jim", 98),
                ("John", 76),
                ("Harry", 82),
                ("Sally", 79),
                ("Lenny", 84),
                ("Abe", 88),
            ],
        );
        assert_eq!(
            run(REMOVE_BY_KEY, vec![int(RT_VALUE), s("NOTFOUND")], &mut slot),
            Ok(None)
        );
        same(
            &ok(REMOVE_BY_KEY, vec![int(RT_VALUE), s("Jim")], &mut slot),
            &int(98),
        );
        same(
            &ok(
                REMOVE_BY_KEY_LIST,
                vec![int(RT_COUNT), strs(&["Sally", "UNKNOWN", "Lenny"])],
                &mut slot,
            ),
            &int(2),
        );
        same(
            &ok(REMOVE_ALL_BY_VALUE, vec![int(RT_KEY), int(55)], &mut slot),
            &strs(&["Charlie"]),
        );
        same(&ok(SIZE, vec![], &mut slot), &int(3));
        slot_is(&slot, &smap(0, &[("John", 76), ("Harry", 82), ("Abe", 88)]));
        same(
            &ok(REMOVE_BY_INDEX, vec![int(RT_KEY), int(0)], &mut slot),
            &s("Abe"),
        );
        same(
            &ok(REMOVE_BY_RANK, vec![int(RT_KEY), int(-1)], &mut slot),
            &s("Harry"),
        );
        same(
            &ok(REMOVE_BY_VALUE, vec![int(RT_KEY), int(76)], &mut slot),
            &s("John"),
        );
        slot_is(&slot, &smap(0, &[]));
        assert_eq!(
            run(REMOVE_BY_VALUE, vec![int(RT_KEY), int(76)], &mut slot),
            Ok(None)
        );
        same(
            &ok(REMOVE_BY_VALUE, vec![int(RT_RANK), int(76)], &mut slot),
            &int(-1),
        );
    }

    #[test]
    fn remove_ranges_match_the_java_client() {
        // The Java client's operateMapRemoveRange.
        let mut slot = smap(
            MAP_KEY_ORDERED,
            &[
                ("Abe", 88),
                ("Charlie", 55),
                ("Harry", 82),
                ("Jim", 98),
                ("John", 76),
                ("Lenny", 84),
                ("Sally", 79),
            ],
        );
        let mut remove = |code: i64, args: Vec<Value>| ok(code, args, &mut slot);
        same(
            &remove(REMOVE_BY_KEY_INTERVAL, vec![int(RT_COUNT), s("J"), s("K")]),
            &int(2),
        );
        same(
            &remove(
                REMOVE_BY_VALUE_INTERVAL,
                vec![int(RT_COUNT), int(80), int(85)],
            ),
            &int(2),
        );
        same(
            &remove(REMOVE_BY_INDEX_RANGE, vec![int(RT_COUNT), int(0), int(2)]),
            &int(2),
        );
        same(
            &remove(REMOVE_BY_RANK_RANGE, vec![int(RT_COUNT), int(0), int(2)]),
            &int(1),
        );
        slot_is(&slot, &smap(MAP_KEY_ORDERED, &[]));
        // Nothing selected, nothing removed; RT_NONE answers nothing.
        let mut slot = imap(MAP_KEY_ORDERED, &[(1, 1), (2, 2)]);
        assert_eq!(
            run(REMOVE_BY_INDEX_RANGE, vec![int(RT_NONE), int(5)], &mut slot),
            Ok(None)
        );
        assert_eq!(
            run(
                REMOVE_BY_INDEX_RANGE,
                vec![int(RT_NONE), int(-1)],
                &mut slot
            ),
            Ok(None)
        );
        slot_is(&slot, &imap(MAP_KEY_ORDERED, &[(1, 1)]));
    }

    #[test]
    fn removes_on_an_absent_map_do_nothing() {
        for code in [76, 77, 78, 79, 81, 82, 83, 84, 85, 86, 87, 88, 89] {
            let mut slot = None;
            assert_eq!(
                run(code, vec![int(RT_COUNT), int(1)], &mut slot),
                Ok(None),
                "{code}"
            );
            // Not even the arguments are read, as the reference.
            assert_eq!(run(code, vec![], &mut slot), Ok(None), "{code}");
            assert!(slot.is_none());
        }
    }

    #[test]
    fn return_type_shapes_for_ranges() {
        let mut slot = smap(0, &[("b", 2), ("a", 1), ("c", 3)]);
        let mut get = |rt: i64| ok(GET_BY_INDEX_RANGE, vec![int(rt), int(1), int(2)], &mut slot);
        same(&get(RT_KEY), &strs(&["b", "c"]));
        same(&get(RT_VALUE), &ints(&[2, 3]));
        same(&get(RT_RANK), &ints(&[1, 2]));
        same(&get(RT_REVERSE_RANK), &ints(&[1, 0]));
        same(&get(RT_EXISTS), &Value::Bool(true));
        same(
            &get(RT_KEY_VALUE),
            &kv(vec![(s("b"), int(2)), (s("c"), int(3))]),
        );
        same(
            &get(RT_UNORDERED_MAP),
            &map_of(0, vec![(s("b"), int(2)), (s("c"), int(3))]),
        );
        same(
            &get(RT_ORDERED_MAP),
            &map_of(MAP_KEY_ORDERED, vec![(s("b"), int(2)), (s("c"), int(3))]),
        );
        // An ordered-map result is sorted by key whatever the listing.
        let mut slot = smap(0, &[("b", 1), ("a", 2)]);
        same(
            &ok(
                GET_BY_RANK_RANGE,
                vec![int(RT_ORDERED_MAP), int(0)],
                &mut slot,
            ),
            &map_of(MAP_KEY_ORDERED, vec![(s("a"), int(2)), (s("b"), int(1))]),
        );
        same(
            &ok(
                GET_BY_RANK_RANGE,
                vec![int(RT_UNORDERED_MAP), int(0)],
                &mut slot,
            ),
            &map_of(0, vec![(s("b"), int(1)), (s("a"), int(2))]),
        );
        // Unknown return types cannot apply (26, as the reference); bits
        // above the INVERTED flag are ignored.
        for rt in [14, 18, 42, -1, 0x20000 | 42] {
            fails(
                GET_BY_INDEX_RANGE,
                vec![int(rt), int(0)],
                &slot,
                CdtError::OpNotApplicable,
            );
        }
        same(
            &ok(
                GET_BY_INDEX_RANGE,
                vec![int(0x20000 | RT_COUNT), int(0)],
                &mut slot,
            ),
            &int(2),
        );
        same(
            &ok(
                GET_BY_INDEX_RANGE,
                vec![int(0x30000 | RT_COUNT), int(1)],
                &mut slot,
            ),
            &int(1),
        );
        for rt in [s("x"), Value::Nil, Value::Double(1.0)] {
            fails(
                GET_BY_INDEX_RANGE,
                vec![rt, int(0)],
                &slot,
                CdtError::Parameter,
            );
        }
    }

    #[test]
    fn wrong_types_are_incompatible() {
        let not_maps = [ints(&[1, 2]), int(7), s("map"), Value::Nil];
        for value in not_maps {
            for code in [64, 67, 68, 73, 75, 76, 85, 96, 97, 104] {
                fails(
                    code,
                    vec![int(1), int(1)],
                    &Some(value.clone()),
                    CdtError::IncompatibleType,
                );
            }
        }
    }

    #[test]
    fn argument_counts_and_types_are_checked() {
        let slot = scores();
        fails(GET_BY_KEY, vec![int(RT_KEY)], &slot, CdtError::Parameter);
        fails(
            GET_BY_KEY,
            vec![int(RT_KEY), s("Jim"), s("Jim")],
            &slot,
            CdtError::Parameter,
        );
        fails(
            GET_BY_KEY,
            vec![s("6"), s("Jim")],
            &slot,
            CdtError::Parameter,
        );
        fails(
            GET_BY_INDEX,
            vec![int(RT_KEY), s("0")],
            &slot,
            CdtError::Parameter,
        );
        fails(
            GET_BY_INDEX,
            vec![int(RT_KEY), Value::UInt(u64::MAX)],
            &slot,
            CdtError::Parameter,
        );
        fails(
            GET_BY_INDEX_RANGE,
            vec![int(RT_KEY), int(0), s("1")],
            &slot,
            CdtError::Parameter,
        );
        fails(
            GET_BY_INDEX_RANGE,
            vec![int(RT_KEY), int(0), int(1), int(1)],
            &slot,
            CdtError::Parameter,
        );
        fails(
            GET_BY_VALUE_INTERVAL,
            vec![int(RT_KEY)],
            &slot,
            CdtError::Parameter,
        );
        fails(
            REMOVE_BY_RANK_RANGE,
            vec![int(RT_KEY), Value::Double(0.0)],
            &slot,
            CdtError::Parameter,
        );
        fails(PUT, vec![int(1)], &slot, CdtError::Parameter);
        fails(
            PUT,
            vec![int(1), int(1), int(0), int(0), int(0)],
            &slot,
            CdtError::Parameter,
        );
        fails(
            PUT,
            vec![int(1), int(1), s("attr")],
            &slot,
            CdtError::Parameter,
        );
        fails(
            PUT,
            vec![int(1), int(1), int(0), int(-4)],
            &slot,
            CdtError::Parameter,
        );
        fails(
            ADD,
            vec![int(1), int(1), int(0), int(0)],
            &slot,
            CdtError::Parameter,
        );
        fails(
            REPLACE,
            vec![int(1), int(1), int(0)],
            &slot,
            CdtError::Parameter,
        );
        fails(REPLACE_ITEMS, vec![], &slot, CdtError::Parameter);
        // A big count is as good as none.
        let mut work = slot.clone();
        same(
            &ok(
                GET_BY_INDEX_RANGE,
                vec![int(RT_COUNT), int(1), Value::UInt(u64::MAX)],
                &mut work,
            ),
            &int(3),
        );
    }

    #[test]
    fn errors_leave_the_slot_unchanged() {
        let maps = [
            scores(),
            imap(MAP_KEY_ORDERED, &[(1, 1), (2, 2)]),
            imap(0, &[]),
        ];
        for start in maps {
            fails(
                PUT,
                vec![s("Jim"), int(1), int(0), int(0x01)],
                &start.clone().map(|m| {
                    let mut m = m;
                    if let Value::Map(map) = &mut m {
                        map.entries.push((s("Jim"), int(0)));
                    }
                    m
                }),
                CdtError::ElementExists,
            );
            fails(
                PUT_ITEMS,
                vec![map_of(
                    0,
                    vec![(s("new"), int(1)), (s("x"), Value::Wildcard)],
                )],
                &start,
                CdtError::Parameter,
            );
            fails(
                REPLACE_ITEMS,
                vec![map_of(0, vec![(s("absent"), int(1))])],
                &start,
                CdtError::ElementNotFound,
            );
            fails(
                GET_BY_RANK,
                vec![int(RT_KEY), int(100)],
                &start,
                CdtError::OpNotApplicable,
            );
            fails(
                REMOVE_BY_KEY_LIST,
                vec![int(RT_RANK), strs(&["Jim"])],
                &start,
                CdtError::OpNotApplicable,
            );
        }
    }

    #[test]
    fn an_unordered_map_with_a_key_twice_becomes_key_ordered_with_it_once() {
        // What the fuzzer found: SET_TYPE to key-ordered kept both entries.
        let mut slot = imap(0, &[(2, 20), (1, 10), (2, 21)]);
        assert!(
            run(SET_TYPE, vec![int(i64::from(MAP_KEY_ORDERED))], &mut slot)
                .expect("applies")
                .is_none()
        );
        slot_is(&slot, &imap(MAP_KEY_ORDERED, &[(1, 10), (2, 21)]));
    }

    #[test]
    fn out_of_order_key_ordered_maps_are_read_and_repaired() {
        // A key-ordered map written whole out of order, with a duplicate.
        let mut slot = imap(MAP_KEY_ORDERED, &[(3, 30), (1, 10), (2, 20), (1, 11)]);
        same(
            &ok(GET_BY_INDEX, vec![int(RT_KEY), int(0)], &mut slot),
            &int(1),
        );
        same(
            &ok(GET_BY_KEY, vec![int(RT_VALUE), int(2)], &mut slot),
            &int(20),
        );
        same(&ok(PUT, vec![int(0), int(0)], &mut slot), &int(4));
        slot_is(
            &slot,
            &imap(MAP_KEY_ORDERED, &[(0, 0), (1, 10), (2, 20), (3, 30)]),
        );
    }

    #[test]
    fn garbage_never_panics() {
        let args_pool: Vec<Vec<Value>> = vec![
            vec![],
            vec![Value::Nil],
            vec![int(i64::MIN), int(i64::MAX), int(-1), int(i64::MIN)],
            vec![
                int(RT_KEY_VALUE | INVERTED),
                Value::Wildcard,
                Value::Infinity,
            ],
            vec![int(RT_RANK), ints(&[1, 2]), int(-3), Value::UInt(u64::MAX)],
            vec![int(RT_INDEX | INVERTED), int(-2), int(1)],
            vec![
                map_of(0, vec![(int(1), Value::Infinity)]),
                int(3),
                int(0xff),
            ],
            vec![
                Value::Double(f64::NAN),
                Value::Double(f64::INFINITY),
                int(3),
            ],
            vec![s("k"), Value::Double(f64::MAX), int(1)],
            vec![
                int(RT_ORDERED_MAP),
                list(vec![Value::Wildcard, Value::Nil]),
                int(1),
                int(1),
            ],
            vec![
                Value::Ext(3, vec![1]),
                Value::Blob(4, vec![]),
                int(0x0f),
                int(0x0f),
            ],
        ];
        let slots = [
            None,
            scores(),
            imap(
                MAP_KEY_ORDERED | MAP_VALUE_ORDERED,
                &[(1, 3), (2, 2), (3, 1)],
            ),
            imap(MAP_KEY_ORDERED, &[(2, 1), (1, 1), (1, 2)]),
            imap(0, &[]),
            Some(ints(&[1])),
        ];
        for code in 60..115 {
            for args in &args_pool {
                for start in &slots {
                    let mut slot = start.clone();
                    if run(code, args.clone(), &mut slot).is_err() {
                        slot_is(&slot, start);
                    }
                    if let Some(Value::Map(map)) = &slot {
                        if map.is_key_ordered() && slot != *start {
                            assert!(strictly_sorted(&map.entries), "code {code} {args:?}");
                        }
                    }
                }
            }
        }
    }
}
