//! Contexts: `[ctx_type, ctx_value, ...]` pairs that walk from the bin into
//! a nested list or map before the op applies there (protocol 05 §2.1).
//!
//! Each step selects one element of the current collection: a list by
//! index, rank or value; a map by index, rank, key or value. Negative
//! indexes and ranks count from the end. A step's type is its kind (low
//! six bits) and create flags (0xc0); the reference ignores its other bits,
//! and so does [`parse`], which checks only the context's shape: a step
//! is judged when it is walked.
//!
//! A path that cannot be followed answers [`CdtError::OpNotApplicable`]
//! (26), for reads and writes alike, as the reference does: a step whose
//! element is missing (an index or rank out of range, a key or value not
//! there), a step of an unknown kind or with a value of the wrong type, a
//! step taken in a scalar element or in a collection of the other kind,
//! and a write's first step on a missing bin. Only a read of a missing bin
//! answers nothing (`operate` never walks it). The element a path leads to
//! is the op's to judge: an op on a scalar or on the other collection kind
//! is `IncompatibleType` (12).
//!
//! A write creates a missing element when its step carries create flags
//! (0x40/0x80/0xc0). Then, as the reference server does, a step's
//! kind and create flags describe the collection it selects *in*: a map
//! key step adds the key to its map, a list index step a slot at its
//! list's end (past the end only with the "unbounded" flag, padded with
//! nils; an ordered list appends whatever the index), and when that
//! collection is itself missing (the bin, or an element being created) it
//! is created as the step's kind in the order its flags name (map 0x80
//! key-ordered, 0xc0 key-value-ordered; list 0xc0 ordered). The element
//! created at the last step is left to the op: a list op makes it a list,
//! a map op a map. Below the first create, steps create what they miss
//! without flags of their own (but one with the persist-index flag 0x100
//! cannot: the reference keeps no index for a nested collection); a
//! created element the op leaves absent is taken back.
//!
//! An ordered list whose element the op changed is re-sorted afterwards by
//! `value::canonicalize`, which `operate` runs over the whole bin after
//! every modify op (so this module does not sort).

use crate::list::MAX_PADDING;
use crate::map::check_key;
use crate::result::{heap_pick, index_of, order_by_value, resolve_index as resolve};
use crate::value::{
    self, List, Map, Value, LIST_ORDERED, MAP_KEY_ORDERED, MAP_VALUE_ORDERED, MAX_DEPTH,
};
use crate::CdtError;
use std::cmp::Ordering;

/// Step kinds (base 0x0f plus collection bits 0x30); [`crate::path`]
/// walks the same ones.
pub(crate) const LIST_INDEX: i64 = 0x10;
pub(crate) const LIST_RANK: i64 = 0x11;
pub(crate) const LIST_VALUE: i64 = 0x13;
pub(crate) const MAP_INDEX: i64 = 0x20;
pub(crate) const MAP_RANK: i64 = 0x21;
pub(crate) const MAP_KEY: i64 = 0x22;
pub(crate) const MAP_VALUE: i64 = 0x23;
/// Create flags, OR-ed into a step's type.
const CREATE_MASK: i64 = 0xc0;
/// A step's kind: the type's low six bits.
const KIND_MASK: i64 = 0x3f;
/// Persist-index flag a create may carry: no effect on the bin's own
/// collection (accepted on a first step, and ignored on a step whose
/// collection exists); a step that must create the collection it selects
/// in, below an element created for the op, cannot follow it
/// (`OpNotApplicable`), as the reference keeps no index for a nested one.
const CREATE_PERSIST: i64 = 0x100;
/// The expression context (`[0x04, expression]`): the 0xff form of a CDT op
/// cannot follow one (the reference answers 26); only path ops take it.
const EXPRESSION: i64 = 0x04;

/// One parsed step.
pub(crate) struct Step {
    kind: i64,
    create: i64,
    persist: bool,
    value: Value,
}

/// Parses the context list: an even number of items (at least two), each
/// type an integer. Nothing else is judged here (see the module doc).
pub(crate) fn parse(items: Vec<Value>) -> Result<Vec<Step>, CdtError> {
    if items.is_empty() || !items.len().is_multiple_of(2) {
        return Err(CdtError::Parameter);
    }
    if items.len() / 2 > MAX_DEPTH {
        // Each step may nest one level deeper (and `apply` recurses once
        // per step): no deeper than a stored value may be.
        return Err(CdtError::Parameter);
    }
    let mut steps = Vec::with_capacity(items.len() / 2);
    let mut items = items.into_iter();
    while let (Some(kind), Some(value)) = (items.next(), items.next()) {
        let raw = kind.as_int().ok_or(CdtError::Parameter)?;
        steps.push(Step {
            kind: raw & KIND_MASK,
            create: raw & CREATE_MASK,
            persist: raw & CREATE_PERSIST != 0,
            value,
        });
    }
    Ok(steps)
}

/// Checks, before any value is at hand, what [`parse`] leaves to the walk,
/// for a context stored to be applied later (a secondary index's): every
/// step of a known kind with a value of the right type, a key a create may
/// add one a map can hold, the persist flag on the first step only.
/// [`CdtError::Unsupported`] for the expression context and unknown bits.
pub(crate) fn check(items: &[Value]) -> Result<(), CdtError> {
    for (at, pair) in items.chunks(2).enumerate() {
        let [kind, value] = pair else {
            return Err(CdtError::Parameter);
        };
        let raw = kind.as_int().ok_or(CdtError::Parameter)?;
        let base = raw & KIND_MASK;
        if raw & !(KIND_MASK | CREATE_MASK | CREATE_PERSIST) != 0 || base == EXPRESSION {
            return Err(CdtError::Unsupported);
        }
        if raw & CREATE_PERSIST != 0 && at > 0 {
            return Err(CdtError::Parameter);
        }
        if !matches!(
            base,
            LIST_INDEX | LIST_RANK | LIST_VALUE | MAP_INDEX | MAP_RANK | MAP_KEY | MAP_VALUE
        ) {
            return Err(CdtError::Parameter);
        }
        if matches!(base, LIST_INDEX | LIST_RANK | MAP_INDEX | MAP_RANK) && value.as_int().is_none()
        {
            return Err(CdtError::Parameter);
        }
        if base == MAP_KEY && raw & CREATE_MASK != 0 {
            check_key(value)?;
        }
    }
    Ok(())
}

/// An op applied where the context leads: the slot in, the result out.
pub(crate) type SlotOp<'a> = dyn FnMut(&mut Option<Value>) -> Result<Option<Value>, CdtError> + 'a;

/// Runs `op` on the element the steps lead to (the bin itself with no
/// steps). `slot` is the bin (`None`: absent).
pub(crate) fn apply(
    slot: &mut Option<Value>,
    steps: &[Step],
    modifies: bool,
    op: &mut SlotOp<'_>,
) -> Result<Option<Value>, CdtError> {
    walk(slot, steps, modifies, false, op)
}

/// One level of [`apply`]. `creating`: `slot` is an element a step above
/// has just created (so it is `None`), and the steps from here create
/// what they miss whether or not they carry create flags, as the
/// reference does once a create has begun.
fn walk(
    slot: &mut Option<Value>,
    steps: &[Step],
    modifies: bool,
    creating: bool,
    op: &mut SlotOp<'_>,
) -> Result<Option<Value>, CdtError> {
    let Some((step, rest)) = steps.split_first() else {
        // The element itself: a missing one is created by the op (a list
        // op makes a list, a map op a map), never by the context.
        return op(slot);
    };
    let Some(current) = slot.as_mut() else {
        if !modifies {
            // A read of a missing bin (`operate` answers it before).
            return Ok(None);
        }
        if (step.create == 0 && !creating) || (creating && step.persist) {
            return Err(CdtError::OpNotApplicable);
        }
        // The collection this step selects in is missing (the bin, or an
        // element being created): create it as the step's kind, in the
        // order its create flags name.
        *slot = Some(new_collection(step));
        let outcome = walk(slot, steps, modifies, true, op);
        if slot
            .as_ref()
            .is_some_and(|created| collection_len(created) == 0)
        {
            // The op left nothing in it (a remove or clear where nothing
            // was): it is taken back too, as the reference takes back what
            // a context created for an op that did nothing.
            *slot = None;
        }
        return outcome;
    };
    let length_before = collection_len(current);
    let (position, created) = match select(current, step)? {
        Some(position) => (position, false),
        None if !modifies || (step.create == 0 && !creating) => {
            return Err(CdtError::OpNotApplicable)
        }
        None => (create(current, step, creating)?, true),
    };
    // A created element starts absent: the next step (or the op) decides
    // what it becomes.
    let placeholder = std::mem::replace(element_mut(current, position), Value::Nil);
    let mut child = (!created).then_some(placeholder);
    let outcome = walk(&mut child, rest, modifies, created, op);
    match child {
        Some(value) => *element_mut(current, position) = value,
        None if created => undo_create(current, position, length_before),
        None => {}
    }
    outcome
}

/// Element count of a list or map (0 for anything else).
fn collection_len(value: &Value) -> usize {
    match value {
        Value::List(list) => list.items.len(),
        Value::Map(map) => map.entries.len(),
        _ => 0,
    }
}

/// Takes back a created element the op left absent (and the nils that
/// padded a list up to it).
fn undo_create(parent: &mut Value, position: Position, length_before: usize) {
    match (parent, position) {
        (Value::List(list), Position::Item(_)) => list.items.truncate(length_before),
        (Value::Map(map), Position::Entry(i)) => {
            map.entries.remove(i);
        }
        _ => {}
    }
}

/// Where an element lives in its parent: a list index or a map entry's
/// value (by entry position).
#[derive(Clone, Copy)]
enum Position {
    Item(usize),
    Entry(usize),
}

fn element_mut(parent: &mut Value, position: Position) -> &mut Value {
    match (parent, position) {
        (Value::List(list), Position::Item(i)) => &mut list.items[i],
        (Value::Map(map), Position::Entry(i)) => &mut map.entries[i].1,
        _ => unreachable!("positions come from select/create on the same parent"),
    }
}

/// The element `step` selects in `parent`: `None` when it is not there.
/// A step of an unknown kind, with a value of the wrong type, or taken in
/// a scalar or in a collection of the other kind cannot be followed.
fn select(parent: &Value, step: &Step) -> Result<Option<Position>, CdtError> {
    let int = || step.value.as_int().ok_or(CdtError::OpNotApplicable);
    Ok(match (parent, step.kind) {
        (Value::List(list), LIST_INDEX) => resolve(int()?, list.items.len()).map(Position::Item),
        (Value::List(list), LIST_RANK) => {
            resolve(int()?, list.items.len()).and_then(|rank| rank_position(list, rank))
        }
        (Value::List(list), LIST_VALUE) => list
            .items
            .iter()
            .position(|item| value::compare(item, &step.value) == Ordering::Equal)
            .map(Position::Item),
        (Value::Map(map), MAP_INDEX) => {
            let order = key_order(map);
            resolve(int()?, order.len()).map(|i| Position::Entry(order[i]))
        }
        (Value::Map(map), MAP_RANK) => {
            let order = order_by_value(map.entries.iter().map(|(_, v)| v));
            resolve(int()?, order.len()).map(|rank| Position::Entry(order[rank]))
        }
        (Value::Map(map), MAP_KEY) => index_of(map, &step.value).map(Position::Entry),
        (Value::Map(map), MAP_VALUE) => map
            .entries
            .iter()
            .position(|(_, v)| value::compare(v, &step.value) == Ordering::Equal)
            .map(Position::Entry),
        _ => return Err(CdtError::OpNotApplicable),
    })
}

/// The position of the element of `rank` in `list`: an ordered list's
/// index, an unordered list's as the reference's heap picks it among equal
/// elements ([`heap_pick`]).
fn rank_position(list: &List, rank: usize) -> Option<Position> {
    if list.is_ordered() {
        return Some(Position::Item(rank));
    }
    let values: Vec<&Value> = list.items.iter().collect();
    heap_pick(&values, rank, 1)
        .first()
        .map(|&i| Position::Item(i))
}

/// Entry positions of a map in key order (stored order when key-ordered).
fn key_order(map: &Map) -> Vec<usize> {
    if map.is_key_ordered() {
        return (0..map.entries.len()).collect();
    }
    order_by_value(map.entries.iter().map(|(k, _)| k))
}

/// The empty collection a create step makes.
fn new_collection(step: &Step) -> Value {
    if step.kind & 0x20 != 0 {
        let flags = match step.create {
            0x80 => MAP_KEY_ORDERED,
            0xc0 => MAP_KEY_ORDERED | MAP_VALUE_ORDERED,
            _ => 0,
        };
        Value::Map(Map {
            flags,
            entries: Vec::new(),
        })
    } else {
        let flags = if step.create == 0xc0 { LIST_ORDERED } else { 0 };
        Value::List(List {
            flags,
            items: Vec::new(),
        })
    }
}

/// Makes room for the element `step` selects and did not find: a map
/// key (in key order when the map is key-ordered), or a list slot. A list
/// takes it at its end (an ordered list at its end whatever the index; the
/// re-sort after the op puts it in place); past the end only with the
/// "unbounded" create flag, padded with nils; index -1 of an empty list is
/// its first slot. The new element is a `Nil` placeholder that
/// [`walk`] fills or takes back. `creating`: the step's own flags need not
/// ask for a create (a step below one that did).
fn create(parent: &mut Value, step: &Step, creating: bool) -> Result<Position, CdtError> {
    debug_assert!(step.create != 0 || creating);
    match (parent, step.kind) {
        (Value::Map(map), MAP_KEY) => {
            check_key(&step.value)?;
            let at = if map.is_key_ordered() {
                map.entries
                    .iter()
                    .position(|(k, _)| value::compare(k, &step.value) == Ordering::Greater)
                    .unwrap_or(map.entries.len())
            } else {
                map.entries.len()
            };
            map.entries.insert(at, (step.value.clone(), Value::Nil));
            Ok(Position::Entry(at))
        }
        (Value::List(list), LIST_INDEX) => {
            let index = step.value.as_int().ok_or(CdtError::OpNotApplicable)?;
            let len = list.items.len();
            let target = if index == -1 && len == 0 {
                0
            } else if index < 0 {
                return Err(CdtError::OpNotApplicable);
            } else {
                usize::try_from(index).map_err(|_| CdtError::Parameter)?
            };
            debug_assert!(target >= len, "select finds every index inside the list");
            if target > len && !list.is_ordered() {
                // Only the "unbounded" create pads with nils, and no further
                // than a list insert may.
                if step.create != 0x80 || target - len > MAX_PADDING {
                    return Err(CdtError::OpNotApplicable);
                }
                list.items.resize(target, Value::Nil);
            }
            list.items.push(Value::Nil);
            Ok(Position::Item(list.items.len() - 1))
        }
        _ => Err(CdtError::OpNotApplicable),
    }
}
