//! List ops (op codes below 64, protocol 05 §2.3): the write ops (set
//! type, append, insert, set, increment, pop, remove, trim, clear, sort),
//! the plain reads (size, get, get range) and the get/remove-by selectors
//! (index, value, rank, value list, index range, value interval, rank
//! range, value-relative rank range), as the reference server answers them.
//!
//! Conventions (the reference's):
//! * A negative index or rank counts from the end. A single-element op
//!   whose index or rank is out of range fails with `OpNotApplicable`; a
//!   range is clamped ([`range_of`]).
//! * A write to an ordered list keeps it sorted: append/append-items add in
//!   order, increment re-places the element; insert and set are refused
//!   (`OpNotApplicable`).
//! * Write flags: `ADD_UNIQUE` refuses a value already in the list
//!   (`ElementExists`), `INSERT_BOUNDED` an index past the end
//!   (`OpNotApplicable`); with `NO_FAIL` a refused write is skipped (the
//!   op answers as if nothing was asked), and with `NO_FAIL | PARTIAL` the
//!   items that pass are added and the others skipped. Insert or set past
//!   the end of an unordered list pads it with nils.
//! * Value arguments that are stored (append, insert, set) must not hold
//!   the wildcard or infinity helpers (`Parameter`).
//! * On a missing list (`slot` is `None`) the writes that create a list do
//!   so (append, append-items and increment with their order attribute;
//!   set-type, insert, insert-items and set unordered, set-type then
//!   applying its flags); removes, trim and clear do nothing and answer
//!   nothing; sort is refused (`IncompatibleType`); reads answer nothing.
//! * Results of selectors go through [`Selection`]: single-element ops
//!   (by index, by rank, by value) answer a scalar and refuse `INVERTED`;
//!   range results list the chosen elements in index order, except that
//!   rank ranges list values in the order the reference's heap took them
//!   and a value list's ranks (on an ordered list all its results) follow
//!   the value list's order (the reference's order); inverted results are
//!   in index order. Indexes of an index range and ranks of a rank or value
//!   selection come as stretches, reversed ones ascending within each, and
//!   an index range over the whole list as `0..n`
//!   ([`crate::result::Shape`]). A value listed twice in a value list
//!   counts at its last listing, but an ordered list answers its matches
//!   (indexes, ranks, values) again for every listing.
//! * Ties (unordered lists): which of equal elements a rank (range,
//!   relative range, context step) names is the reference's heap's choice
//!   ([`heap_pick`]), not the first by index; an element chosen by index
//!   is ranked by the number of elements less than it, so equal elements
//!   share a rank ([`RankTies::Shared`]).
//!
//! Invariants: [`apply`] never panics on any input (`value::compare` is a
//! total order on stored values: NaN sorts last, and wildcard/infinity are
//! refused in anything stored); an error leaves `slot`
//! unchanged (every op validates its arguments and decides its outcome
//! before it mutates, and a list created for a missing slot is only stored
//! on success); an ordered list is sorted after every op.

use crate::result::{
    heap_pick, last_occurrences, parse_return_type, range_of, ranks_of, resolve_index, Extent,
    InvertedExists, RankTies, ReturnType, Selection, Shape, Space, Whole,
};
use crate::value::{self, List, Value, LIST_ORDERED, PERSIST_INDEX};
use crate::CdtError;
use std::cmp::Ordering;

/// List op codes (05 §2.3).
mod code {
    pub const SET_TYPE: i64 = 0;
    pub const APPEND: i64 = 1;
    pub const APPEND_ITEMS: i64 = 2;
    pub const INSERT: i64 = 3;
    pub const INSERT_ITEMS: i64 = 4;
    pub const POP: i64 = 5;
    pub const POP_RANGE: i64 = 6;
    pub const REMOVE: i64 = 7;
    pub const REMOVE_RANGE: i64 = 8;
    pub const SET: i64 = 9;
    pub const TRIM: i64 = 10;
    pub const CLEAR: i64 = 11;
    pub const INCREMENT: i64 = 12;
    pub const SORT: i64 = 13;
    pub const SIZE: i64 = 16;
    pub const GET: i64 = 17;
    pub const GET_RANGE: i64 = 18;
    pub const GET_BY_INDEX: i64 = 19;
    pub const GET_BY_VALUE: i64 = 20;
    pub const GET_BY_RANK: i64 = 21;
    pub const GET_ALL_BY_VALUE: i64 = 22;
    pub const GET_ALL_BY_VALUE_LIST: i64 = 23;
    pub const GET_BY_INDEX_RANGE: i64 = 24;
    pub const GET_BY_VALUE_INTERVAL: i64 = 25;
    pub const GET_BY_RANK_RANGE: i64 = 26;
    pub const GET_BY_VALUE_REL_RANK_RANGE: i64 = 27;
    /// REMOVE_BY_INDEX..=REMOVE_BY_VALUE_REL_RANK_RANGE mirror
    /// GET_BY_INDEX..=GET_BY_VALUE_REL_RANK_RANGE.
    pub const REMOVE_BY_INDEX: i64 = 32;
    pub const REMOVE_BY_VALUE_REL_RANK_RANGE: i64 = 40;
    /// A REMOVE_BY_* code is its GET_BY_* code plus this.
    pub const REMOVE_BY_OFFSET: i64 = REMOVE_BY_INDEX - GET_BY_INDEX;
}

/// Write flags (list policy).
const ADD_UNIQUE: u64 = 0x01;
const INSERT_BOUNDED: u64 = 0x02;
const NO_FAIL: u64 = 0x04;
const PARTIAL: u64 = 0x08;

/// Sort flags.
const SORT_DESCENDING: u64 = 0x01;
const SORT_DROP_DUPLICATES: u64 = 0x02;

/// The flags a list may carry (set-type and the create attribute).
const VALID_LIST_FLAGS: u64 = (LIST_ORDERED | PERSIST_INDEX) as u64;

/// Insert and set refuse an index above this (the reference's bound).
const MAX_INDEX: i64 = i32::MAX as i64;

/// Most nils an insert or set past the end may pad with. The reference
/// pads up to its record size limit (1 MiB by default: a million nils);
/// beyond this the write is refused rather than allocate without bound.
pub(crate) const MAX_PADDING: usize = 1 << 20;

/// Ext type of the wildcard / infinity helpers (never stored).
const CMP_EXT_TYPE: u8 = 0xff;

/// Whether `code` is a modifying list op (`Some(true)`), a read
/// (`Some(false)`) or no list op at all (`None`).
pub(crate) fn is_modify(code: i64) -> Option<bool> {
    match code {
        code::SET_TYPE..=code::SORT => Some(true),
        code::SIZE..=code::GET_BY_VALUE_REL_RANK_RANGE => Some(false),
        code::REMOVE_BY_INDEX..=code::REMOVE_BY_VALUE_REL_RANK_RANGE => Some(true),
        _ => None,
    }
}

/// Applies list op `code` with its `args` to the list in `slot` (`None`:
/// missing). Returns the op's result, if it has one.
pub(crate) fn apply(
    code: i64,
    args: &[Value],
    slot: &mut Option<Value>,
) -> Result<Option<Value>, CdtError> {
    let modifies = is_modify(code).ok_or(CdtError::Parameter)?;
    match slot {
        Some(Value::List(list)) => {
            if list.is_ordered() && !is_sorted(&list.items) {
                // A stored "ordered" list whose bytes are not sorted (a
                // client wrote them so): sort the working copy first.
                sort_items(&mut list.items);
            }
            let result = run(code, args, list);
            debug_assert!(
                !list.is_ordered() || is_sorted(&list.items),
                "ordered list left unsorted by op {code}"
            );
            result
        }
        Some(_) => Err(CdtError::IncompatibleType),
        None if !modifies => Ok(None),
        None => match on_missing(code, args)? {
            Creation::Create(flags) => {
                let mut fresh = List {
                    flags,
                    items: Vec::new(),
                };
                let result = run(code, args, &mut fresh)?;
                debug_assert!(!fresh.is_ordered() || is_sorted(&fresh.items));
                *slot = Some(Value::List(fresh));
                Ok(result)
            }
            Creation::NoOp => Ok(None),
            Creation::Refuse(error) => Err(error),
        },
    }
}

/// Sorts list items into the reference order (stable).
pub(crate) fn sort_items(items: &mut [Value]) {
    items.sort_by(crate::value::compare_total);
}

/// What a modifying op does to a missing list.
enum Creation {
    /// Creates an empty list with these flags, then applies.
    Create(u8),
    /// Does nothing and answers nothing.
    NoOp,
    /// Fails.
    Refuse(CdtError),
}

/// How the modifying op `code` treats a missing list.
fn on_missing(code: i64, args: &[Value]) -> Result<Creation, CdtError> {
    let attribute_at = match code {
        code::APPEND | code::APPEND_ITEMS => Some(1),
        code::INCREMENT => Some(2),
        code::SET_TYPE | code::INSERT | code::INSERT_ITEMS | code::SET => None,
        code::SORT => return Ok(Creation::Refuse(CdtError::IncompatibleType)),
        _ => return Ok(Creation::NoOp),
    };
    let flags = match attribute_at.and_then(|i| args.get(i)) {
        None => 0,
        // An attribute the list cannot carry creates an unordered list.
        Some(arg) => match flags_arg(arg)? {
            f if f & !VALID_LIST_FLAGS == 0 => f as u8,
            _ => 0,
        },
    };
    Ok(Creation::Create(flags))
}

/// Runs one op on an existing list.
fn run(code: i64, args: &[Value], list: &mut List) -> Result<Option<Value>, CdtError> {
    match code {
        code::SET_TYPE => set_type(list, args),
        code::APPEND | code::APPEND_ITEMS => append(list, args, code == code::APPEND_ITEMS),
        code::INSERT | code::INSERT_ITEMS => insert(list, args, code == code::INSERT_ITEMS),
        code::SET => set(list, args),
        code::INCREMENT => increment(list, args),
        code::SORT => sort(list, args),
        code::CLEAR => {
            list.items.clear();
            Ok(None)
        }
        code::POP | code::REMOVE | code::GET => {
            arity(args, 1, 1)?;
            let selector = Selector::Index(int_arg(&args[0])?);
            let rt = if code == code::REMOVE {
                ReturnType::Count
            } else {
                ReturnType::Value
            };
            select(list, selector, rt, false, code != code::GET)
        }
        code::POP_RANGE | code::REMOVE_RANGE | code::GET_RANGE => {
            arity(args, 1, 2)?;
            let selector = Selector::IndexRange(
                int_arg(&args[0])?,
                args.get(1).map(count_arg).transpose()?.flatten(),
            );
            let rt = if code == code::REMOVE_RANGE {
                ReturnType::Count
            } else {
                ReturnType::Value
            };
            select(list, selector, rt, false, code != code::GET_RANGE)
        }
        code::TRIM => {
            arity(args, 2, 2)?;
            let selector = Selector::IndexRange(int_arg(&args[0])?, count_arg(&args[1])?);
            // Trim removes everything outside the range: the inverted range.
            select(list, selector, ReturnType::Count, true, true)
        }
        code::SIZE => Ok(Some(Value::Int(len_i64(list.items.len())))),
        code::GET_BY_INDEX..=code::GET_BY_VALUE_REL_RANK_RANGE => {
            by_selector(list, code, args, false)
        }
        code::REMOVE_BY_INDEX..=code::REMOVE_BY_VALUE_REL_RANK_RANGE => {
            by_selector(list, code - code::REMOVE_BY_OFFSET, args, true)
        }
        _ => Err(CdtError::Parameter),
    }
}

// ---------------------------------------------------------------------------
// Arguments.

/// Refuses an argument count outside `min..=max`.
fn arity(args: &[Value], min: usize, max: usize) -> Result<(), CdtError> {
    if (min..=max).contains(&args.len()) {
        Ok(())
    } else {
        Err(CdtError::Parameter)
    }
}

/// An index or rank argument.
fn int_arg(arg: &Value) -> Result<i64, CdtError> {
    arg.as_int().ok_or(CdtError::Parameter)
}

/// A count argument: `None` when it is too large to limit anything. The
/// wire count is unsigned, so a negative one (the Go client's -1) is a
/// huge count: "to the end".
fn count_arg(arg: &Value) -> Result<Option<i64>, CdtError> {
    match arg {
        Value::Int(count) if *count < 0 => Ok(None),
        Value::Int(count) => Ok(Some(*count)),
        Value::UInt(_) => Ok(None),
        _ => Err(CdtError::Parameter),
    }
}

/// A flags argument (an unsigned integer on the wire; a negative one is
/// taken as its two's complement bits, as the reference reads it).
fn flags_arg(arg: &Value) -> Result<u64, CdtError> {
    match arg {
        Value::Int(flags) => Ok(*flags as u64),
        Value::UInt(flags) => Ok(*flags),
        _ => Err(CdtError::Parameter),
    }
}

/// The optional write-flags argument at `at`.
fn write_flags_arg(args: &[Value], at: usize) -> Result<WriteFlags, CdtError> {
    Ok(WriteFlags(
        args.get(at).map(flags_arg).transpose()?.unwrap_or(0),
    ))
}

/// A value to store: it must not hold a range helper.
fn stored_arg(arg: &Value) -> Result<&Value, CdtError> {
    if is_storable(arg) {
        Ok(arg)
    } else {
        Err(CdtError::Parameter)
    }
}

/// A list of values to store.
fn stored_items_arg(arg: &Value) -> Result<&[Value], CdtError> {
    match arg {
        Value::List(items) if items.items.iter().all(is_storable) => Ok(&items.items),
        _ => Err(CdtError::Parameter),
    }
}

/// Whether `value` may be stored: no wildcard or infinity anywhere in it
/// (nor another ext of the helpers' type the reference treats as one).
fn is_storable(value: &Value) -> bool {
    match value {
        Value::Wildcard | Value::Infinity => false,
        Value::Ext(CMP_EXT_TYPE, data) => !(1..=3).contains(&data.len()),
        Value::List(list) => list.items.iter().all(is_storable),
        Value::Map(map) => map
            .entries
            .iter()
            .all(|(k, v)| is_storable(k) && is_storable(v)),
        _ => true,
    }
}

/// A length as the integer results carry it.
fn len_i64(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

/// The write flags of append, insert, set and increment.
#[derive(Clone, Copy)]
struct WriteFlags(u64);

impl WriteFlags {
    fn unique(self) -> bool {
        self.0 & ADD_UNIQUE != 0
    }

    fn bounded(self) -> bool {
        self.0 & INSERT_BOUNDED != 0
    }

    fn no_fail(self) -> bool {
        self.0 & NO_FAIL != 0
    }

    /// PARTIAL only counts together with NO_FAIL.
    fn partial(self) -> bool {
        self.0 & (NO_FAIL | PARTIAL) == NO_FAIL | PARTIAL
    }

    /// A write the flags refuse: skipped (`Ok`) under NO_FAIL, else `error`.
    fn refuse(self, error: CdtError) -> Result<(), CdtError> {
        if self.no_fail() {
            Ok(())
        } else {
            Err(error)
        }
    }
}

// ---------------------------------------------------------------------------
// Writes.

/// Whether `items` holds an element equal to `value`.
fn contains(items: &[Value], value: &Value) -> bool {
    items
        .iter()
        .any(|item| value::compare(item, value) == Ordering::Equal)
}

/// Whether `items` is in the reference order.
fn is_sorted(items: &[Value]) -> bool {
    items
        .windows(2)
        .all(|pair| value::compare(&pair[0], &pair[1]) != Ordering::Greater)
}

/// SET_TYPE: `[flags]`. Sorts the list when it becomes ordered.
fn set_type(list: &mut List, args: &[Value]) -> Result<Option<Value>, CdtError> {
    arity(args, 1, 1)?;
    let flags = flags_arg(&args[0])?;
    if flags & !VALID_LIST_FLAGS != 0 {
        return Err(CdtError::OpNotApplicable);
    }
    let flags = flags as u8;
    if flags & LIST_ORDERED != 0 && !list.is_ordered() {
        sort_items(&mut list.items);
    }
    list.flags = flags;
    Ok(None)
}

/// APPEND `[value, attr?, flags?]` / APPEND_ITEMS `[list, attr?, flags?]`:
/// adds at the end (in order, for an ordered list); answers the new size.
/// The attribute only matters when the list is created.
fn append(list: &mut List, args: &[Value], many: bool) -> Result<Option<Value>, CdtError> {
    arity(args, 1, 3)?;
    let items = if many {
        stored_items_arg(&args[0])?
    } else {
        std::slice::from_ref(stored_arg(&args[0])?)
    };
    if let Some(attribute) = args.get(1) {
        flags_arg(attribute)?;
    }
    let flags = write_flags_arg(args, 2)?;
    let size = if list.is_ordered() {
        add_ordered(list, items, many, flags)?
    } else {
        let end = len_i64(list.items.len());
        insert_unordered(list, end, items, many, flags)?
    };
    Ok(Some(Value::Int(len_i64(size))))
}

/// INSERT `[index, value, flags?]` / INSERT_ITEMS `[index, list, flags?]`:
/// answers the new size. Refused on an ordered list.
fn insert(list: &mut List, args: &[Value], many: bool) -> Result<Option<Value>, CdtError> {
    arity(args, 2, 3)?;
    let index = int_arg(&args[0])?;
    let items = if many {
        stored_items_arg(&args[1])?
    } else {
        std::slice::from_ref(stored_arg(&args[1])?)
    };
    let flags = write_flags_arg(args, 2)?;
    if list.is_ordered() {
        return Err(CdtError::OpNotApplicable);
    }
    let size = insert_unordered(list, index, items, many, flags)?;
    Ok(Some(Value::Int(len_i64(size))))
}

/// Where an insert at `index` goes in a list of `len`: a negative index
/// counts from the end; before the start or above [`MAX_INDEX`] is refused.
fn insert_position(index: i64, len: usize) -> Result<usize, CdtError> {
    if index > MAX_INDEX {
        return Err(CdtError::OpNotApplicable);
    }
    let at = if index < 0 {
        index.saturating_add(len_i64(len))
    } else {
        index
    };
    usize::try_from(at).map_err(|_| CdtError::OpNotApplicable)
}

/// Inserts `items` at `index` of an unordered list (`many`: they came as a
/// list, so duplicates among them count too), padding with nils past the
/// end. Returns the list's size afterwards (unchanged when skipped).
fn insert_unordered(
    list: &mut List,
    index: i64,
    items: &[Value],
    many: bool,
    flags: WriteFlags,
) -> Result<usize, CdtError> {
    let len = list.items.len();
    if items.is_empty() {
        return Ok(len);
    }
    let at = insert_position(index, len)?;
    if flags.bounded() && at > len {
        flags.refuse(CdtError::OpNotApplicable)?;
        return Ok(len);
    }
    let admitted = if flags.unique() {
        match admit_unique(&list.items, items, many, flags)? {
            Some(admitted) => admitted,
            None => return Ok(len),
        }
    } else {
        items.iter().collect()
    };
    let padding = at.saturating_sub(len);
    if padding > MAX_PADDING {
        return Err(CdtError::OpNotApplicable);
    }
    if padding > 0 {
        list.items.resize(at, Value::Nil);
    }
    list.items.splice(at..at, admitted.into_iter().cloned());
    Ok(list.items.len())
}

/// ADD_UNIQUE for an unordered list: the items to add, or `None` when the
/// write is skipped. An item already in the list is refused with
/// `ElementExists`; one repeating an earlier item of the same list with
/// `OpNotApplicable` (the reference's codes). PARTIAL drops the refused
/// items and keeps the others.
fn admit_unique<'a>(
    existing: &[Value],
    items: &'a [Value],
    many: bool,
    flags: WriteFlags,
) -> Result<Option<Vec<&'a Value>>, CdtError> {
    if !many {
        return Ok(match items.first() {
            Some(item) if contains(existing, item) => {
                flags.refuse(CdtError::ElementExists)?;
                None
            }
            _ => Some(items.iter().collect()),
        });
    }
    let mut admitted = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if contains(existing, item) {
            if flags.partial() {
                continue;
            }
            flags.refuse(CdtError::ElementExists)?;
            return Ok(None);
        }
        if contains(&items[..i], item) {
            if !flags.no_fail() {
                return Err(CdtError::OpNotApplicable);
            }
            if !flags.partial() {
                return Ok(None);
            }
            continue;
        }
        admitted.push(item);
    }
    if admitted.is_empty() {
        flags.refuse(CdtError::ElementExists)?;
        return Ok(None);
    }
    Ok(Some(admitted))
}

/// Adds `items` to an ordered list, each at its place (`many`: they came
/// as a list). Returns the size afterwards. ADD_UNIQUE as for unordered
/// lists: a repeat among the items is `OpNotApplicable` (skipped under
/// NO_FAIL, dropped under PARTIAL), a value already held `ElementExists`.
fn add_ordered(
    list: &mut List,
    items: &[Value],
    many: bool,
    flags: WriteFlags,
) -> Result<usize, CdtError> {
    let len = list.items.len();
    let mut sorted: Vec<&Value> = items.iter().collect();
    sorted.sort_by(|a, b| value::compare_total(a, b));
    if flags.unique() {
        if many {
            let before = sorted.len();
            sorted.dedup_by(|later, earlier| value::compare(later, earlier) == Ordering::Equal);
            if sorted.len() != before {
                if !flags.no_fail() {
                    return Err(CdtError::OpNotApplicable);
                }
                if !flags.partial() {
                    return Ok(len);
                }
            }
        }
        let mut admitted = Vec::with_capacity(sorted.len());
        for item in sorted {
            if contains_sorted(&list.items, item) {
                if many && flags.partial() {
                    continue;
                }
                flags.refuse(CdtError::ElementExists)?;
                return Ok(len);
            }
            admitted.push(item);
        }
        sorted = admitted;
    }
    if sorted.is_empty() {
        return Ok(len);
    }
    list.items.extend(sorted.into_iter().cloned());
    // Stable: the new items go after the existing equal ones.
    sort_items(&mut list.items);
    Ok(list.items.len())
}

/// Whether the sorted `items` holds an element equal to `value`.
fn contains_sorted(items: &[Value], value: &Value) -> bool {
    let at = items.partition_point(|item| value::compare(item, value) == Ordering::Less);
    items
        .get(at)
        .is_some_and(|item| value::compare(item, value) == Ordering::Equal)
}

/// SET `[index, value, flags?]`: replaces the element; past the end, pads
/// with nils (an insert). Refused on an ordered list. Answers nothing.
fn set(list: &mut List, args: &[Value]) -> Result<Option<Value>, CdtError> {
    arity(args, 2, 3)?;
    let index = int_arg(&args[0])?;
    let item = stored_arg(&args[1])?;
    let flags = write_flags_arg(args, 2)?;
    if list.is_ordered() {
        return Err(CdtError::OpNotApplicable);
    }
    set_unordered(list, index, item, flags)?;
    Ok(None)
}

/// Sets element `index` of an unordered list to `item` (an insert past
/// the end). ADD_UNIQUE refuses a value held by another element.
fn set_unordered(
    list: &mut List,
    index: i64,
    item: &Value,
    flags: WriteFlags,
) -> Result<(), CdtError> {
    if index >= len_i64(list.items.len()) {
        insert_unordered(list, index, std::slice::from_ref(item), false, flags)?;
        return Ok(());
    }
    let at = insert_position(index, list.items.len())?;
    if flags.unique()
        && list
            .items
            .iter()
            .enumerate()
            .any(|(i, other)| i != at && value::compare(other, item) == Ordering::Equal)
    {
        return flags.refuse(CdtError::ElementExists);
    }
    match list.items.get_mut(at) {
        Some(slot) => *slot = item.clone(),
        None => return Err(CdtError::OpNotApplicable),
    }
    Ok(())
}

/// INCREMENT `[index, delta?, attr?, flags?]`: adds `delta` (default 1) to
/// a numeric element and answers the new value. An integer element stays
/// an integer (a float delta truncated), a float element a float; a
/// missing element (past the end) becomes the delta, padded as by set. A
/// non-numeric element or delta is a parameter error (as the reference).
fn increment(list: &mut List, args: &[Value]) -> Result<Option<Value>, CdtError> {
    arity(args, 1, 4)?;
    let index = int_arg(&args[0])?;
    if let Some(attribute) = args.get(2) {
        flags_arg(attribute)?;
    }
    let flags = write_flags_arg(args, 3)?;
    // The index is checked before the delta, as the reference.
    let at = insert_position(index, list.items.len())?;
    let delta = match args.get(1) {
        None | Some(Value::Nil) => Value::Int(1),
        Some(delta @ (Value::Int(_) | Value::Double(_))) => delta.clone(),
        Some(_) => return Err(CdtError::Parameter),
    };
    let sum = match (list.items.get(at), &delta) {
        (None, delta) => delta.clone(),
        (Some(Value::Int(current)), Value::Int(delta)) => Value::Int(current.wrapping_add(*delta)),
        // The reference truncates a float delta to the integer's type.
        (Some(Value::Int(current)), Value::Double(delta)) => {
            Value::Int(current.wrapping_add(*delta as i64))
        }
        (Some(Value::Double(current)), Value::Int(delta)) => Value::Double(current + *delta as f64),
        (Some(Value::Double(current)), Value::Double(delta)) => Value::Double(current + delta),
        (Some(_), _) => return Err(CdtError::Parameter),
    };
    if list.is_ordered() {
        replace_ordered(list, at, &sum, flags)?;
    } else {
        set_unordered(list, len_i64(at), &sum, flags)?;
    }
    Ok(Some(sum))
}

/// Replaces element `at` of an ordered list with `item` (adds it when `at`
/// is the end), keeping the order. Past the end is refused.
fn replace_ordered(
    list: &mut List,
    at: usize,
    item: &Value,
    flags: WriteFlags,
) -> Result<(), CdtError> {
    let len = list.items.len();
    if at > len {
        return Err(CdtError::OpNotApplicable);
    }
    if flags.unique() {
        let first = list
            .items
            .partition_point(|other| value::compare(other, item) == Ordering::Less);
        let found = list
            .items
            .get(first)
            .is_some_and(|other| value::compare(other, item) == Ordering::Equal);
        if found {
            // The element itself already holds the value: nothing to do.
            if first == at {
                return Ok(());
            }
            return flags.refuse(CdtError::ElementExists);
        }
    }
    if at < len {
        list.items.remove(at);
    }
    let place = list
        .items
        .partition_point(|other| value::compare(other, item) != Ordering::Greater);
    list.items.insert(place, item.clone());
    Ok(())
}

/// SORT `[flags?]`: sorts (descending with flag 1; an ordered list keeps
/// its order) and drops duplicates with flag 2. Answers nothing.
fn sort(list: &mut List, args: &[Value]) -> Result<Option<Value>, CdtError> {
    arity(args, 0, 1)?;
    let flags = args.first().map(flags_arg).transpose()?.unwrap_or(0);
    if !list.is_ordered() {
        if flags & SORT_DESCENDING != 0 {
            list.items.sort_by(|a, b| value::compare_total(b, a));
        } else {
            sort_items(&mut list.items);
        }
    }
    if flags & SORT_DROP_DUPLICATES != 0 {
        list.items
            .dedup_by(|later, earlier| value::compare(later, earlier) == Ordering::Equal);
    }
    Ok(None)
}

// ---------------------------------------------------------------------------
// Selectors.

/// Which elements a selector op names.
enum Selector<'a> {
    /// One element by index.
    Index(i64),
    /// The first element equal to the value.
    Value(&'a Value),
    /// One element by rank.
    Rank(i64),
    /// Every element equal to the value.
    AllByValue(&'a Value),
    /// Every element equal to one of the values.
    ValueList(&'a [Value]),
    /// `count` elements (all to the end when `None`) from an index.
    IndexRange(i64, Option<i64>),
    /// Elements in `[begin, end)` (`end` `None`: no upper bound).
    ValueInterval(&'a Value, Option<&'a Value>),
    /// `count` elements from a rank.
    RankRange(i64, Option<i64>),
    /// `count` elements from a rank relative to where the value would sort.
    RelativeRankRange(&'a Value, i64, Option<i64>),
}

/// How the reference lists a selector's results.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    /// Index ranges (and, on ordered lists, every rank or value range).
    IndexRange,
    /// Rank ranges of unordered lists.
    RankRange,
    /// Value matches and intervals of unordered lists.
    ValueMatch,
    /// Value lists.
    ValueList,
}

/// The elements a selector chose, in its natural order (index order; rank
/// order for rank selectors), and whether it names one element.
struct Choice {
    chosen: Vec<usize>,
    single: bool,
    family: Family,
    /// How the reference describes the choice beyond its elements.
    shape: Option<Shape>,
    /// The rank a single-element rank selector asked for (what RANK
    /// answers, whichever of equal elements it picked).
    rank: Option<usize>,
}

/// A GET_BY_* op (`code` 19..=27) on `list`; `remove` for the REMOVE_BY_*
/// twin, which also removes the selected elements.
fn by_selector(
    list: &mut List,
    code: i64,
    args: &[Value],
    remove: bool,
) -> Result<Option<Value>, CdtError> {
    let (min, max) = match code {
        code::GET_BY_INDEX_RANGE | code::GET_BY_VALUE_INTERVAL | code::GET_BY_RANK_RANGE => (2, 3),
        code::GET_BY_VALUE_REL_RANK_RANGE => (3, 4),
        _ => (2, 2),
    };
    arity(args, min, max)?;
    let (rt, inverted) = parse_return_type(args.first())?;
    let optional_count = |at: usize| args.get(at).map(count_arg).transpose().map(Option::flatten);
    let selector = match code {
        code::GET_BY_INDEX => Selector::Index(int_arg(&args[1])?),
        code::GET_BY_VALUE => Selector::Value(&args[1]),
        code::GET_BY_RANK => Selector::Rank(int_arg(&args[1])?),
        code::GET_ALL_BY_VALUE => Selector::AllByValue(&args[1]),
        code::GET_ALL_BY_VALUE_LIST => match &args[1] {
            Value::List(values) => Selector::ValueList(&values.items),
            _ => return Err(CdtError::Parameter),
        },
        code::GET_BY_INDEX_RANGE => Selector::IndexRange(int_arg(&args[1])?, optional_count(2)?),
        code::GET_BY_VALUE_INTERVAL => Selector::ValueInterval(&args[1], args.get(2)),
        code::GET_BY_RANK_RANGE => Selector::RankRange(int_arg(&args[1])?, optional_count(2)?),
        code::GET_BY_VALUE_REL_RANK_RANGE => {
            Selector::RelativeRankRange(&args[1], int_arg(&args[2])?, optional_count(3)?)
        }
        _ => return Err(CdtError::Parameter),
    };
    select(list, selector, rt, inverted, remove)
}

/// Chooses the elements `selector` names, shapes the result `rt` asks for
/// and, with `remove`, removes them.
fn select(
    list: &mut List,
    selector: Selector,
    rt: ReturnType,
    inverted: bool,
    remove: bool,
) -> Result<Option<Value>, CdtError> {
    if matches!(
        rt,
        ReturnType::Key | ReturnType::KeyValue | ReturnType::UnorderedMap | ReturnType::OrderedMap
    ) {
        // Map-only return types.
        return Err(CdtError::OpNotApplicable);
    }
    // An ordered list answers a value list's numbers and values once for
    // every time a value is listed (the reference's).
    let repeat = !inverted
        && matches!(
            rt,
            ReturnType::Index
                | ReturnType::ReverseIndex
                | ReturnType::Rank
                | ReturnType::ReverseRank
                | ReturnType::Value
        );
    let choice = choose(&list.items, list.is_ordered(), &selector, repeat)?;
    if inverted && choice.single {
        return Err(CdtError::OpNotApplicable);
    }
    // An unordered list ranks what it picks by index by the values below
    // it (ordered: rank is index).
    let rank_ties = if !list.is_ordered() && choice.family == Family::IndexRange {
        RankTies::Shared
    } else {
        RankTies::ByIndex
    };
    let len = list.items.len();
    let mut selection = Selection {
        keys: None,
        values: list.items.iter().collect(),
        chosen: choice.chosen,
        single: choice.single,
        shape: choice.shape,
        inverted,
        rank_ties,
    };
    if inverted {
        selection.invert();
    } else {
        arrange(
            &mut selection.chosen,
            rt,
            choice.family,
            list.is_ordered(),
            &list.items,
        );
    }
    let result = match (choice.rank, rt) {
        (Some(rank), ReturnType::Rank) => Some(Value::Int(len_i64(rank))),
        (Some(rank), ReturnType::ReverseRank) => Some(Value::Int(len_i64(len - 1 - rank))),
        // A single value not found: no result, as the reference.
        _ if selection.single && selection.chosen.is_empty() && rt == ReturnType::Value => None,
        _ => selection.result(rt)?,
    };
    let chosen = selection.chosen;
    if remove && !chosen.is_empty() {
        let mut doomed = vec![false; list.items.len()];
        for i in chosen {
            if let Some(flag) = doomed.get_mut(i) {
                *flag = true;
            }
        }
        let mut position = 0;
        list.items.retain(|_| {
            let keep = !doomed.get(position).copied().unwrap_or(false);
            position += 1;
            keep
        });
    }
    Ok(result)
}

/// The elements `selector` names in `items` (an ordered list when
/// `ordered`). A single index or rank out of range is `OpNotApplicable`.
/// With `repeat`, an ordered list's value list chooses a value's matches
/// again each time the value is listed.
fn choose(
    items: &[Value],
    ordered: bool,
    selector: &Selector,
    repeat: bool,
) -> Result<Choice, CdtError> {
    let len = items.len();
    let choice = |chosen, single, family, shape| Choice {
        chosen,
        single,
        family,
        shape,
        rank: None,
    };
    let choice = match *selector {
        Selector::Index(index) => {
            let at = resolve_index(index, len).ok_or(CdtError::OpNotApplicable)?;
            choice(vec![at], true, Family::IndexRange, None)
        }
        Selector::Value(value) => {
            let first = items.iter().position(|item| equal(item, value));
            choice(first.into_iter().collect(), true, Family::ValueMatch, None)
        }
        Selector::Rank(wanted) => {
            let at = resolve_index(wanted, len).ok_or(CdtError::OpNotApplicable)?;
            let chosen = ranked(items, ordered, at, at + 1);
            Choice {
                rank: Some(at),
                ..choice(chosen, true, Family::RankRange, None)
            }
        }
        Selector::AllByValue(value) => {
            let chosen = positions(items, |item| equal(item, value));
            let start = count_below(items, value);
            let shape = by_value(split(start, start + chosen.len()));
            choice(chosen, false, Family::ValueMatch, Some(shape))
        }
        Selector::ValueList(values) => {
            let chosen = value_list_matches(items, values, ordered, repeat);
            let shape = Shape::new(Space::Rank, Extent::Set);
            choice(chosen, false, Family::ValueList, Some(shape))
        }
        Selector::IndexRange(index, count) => {
            let (start, end) = range_of(index, count, len)?;
            let shape = Shape::new(Space::Index, Extent::range(start, end)).whole(Whole::Always);
            choice(
                (start..end).collect(),
                false,
                Family::IndexRange,
                Some(shape),
            )
        }
        Selector::ValueInterval(begin, end) => {
            let chosen = positions(items, |item| {
                value::compare(item, begin) != Ordering::Less
                    && end.is_none_or(|end| value::compare(item, end) == Ordering::Less)
            });
            let start = count_below(items, begin);
            let shape = by_value(split(start, start + chosen.len()));
            choice(chosen, false, Family::ValueMatch, Some(shape))
        }
        Selector::RankRange(rank, count) => {
            let (start, end) = range_of(rank, count, len)?;
            let chosen = ranked(items, ordered, start, end);
            choice(
                chosen,
                false,
                Family::RankRange,
                Some(by_rank(split(start, end))),
            )
        }
        Selector::RelativeRankRange(value, rank, count) => {
            let (start, end) = relative_range(items, value, rank, count)?;
            let chosen = ranked(items, ordered, start, end);
            choice(
                chosen,
                false,
                Family::RankRange,
                Some(by_rank(split(start, end))),
            )
        }
    };
    Ok(if ordered {
        as_index_ranges(choice)
    } else {
        choice
    })
}

/// On an ordered list index is rank: the reference answers every range as
/// an index range, whatever it numbers (a value list is not one).
fn as_index_ranges(mut choice: Choice) -> Choice {
    if choice.family != Family::ValueList {
        choice.family = Family::IndexRange;
    }
    choice.shape = choice
        .shape
        .and_then(|shape| match (choice.family, shape.extent) {
            (Family::ValueList, _) => None,
            (_, Extent::Range { start, end, .. }) => {
                Some(Shape::new(Space::Both, Extent::range(start, end)))
            }
            (_, Extent::Set) => None,
        });
    choice
}

fn equal(item: &Value, value: &Value) -> bool {
    value::compare(item, value) == Ordering::Equal
}

/// The positions of the items `accept` takes, in index order.
fn positions(items: &[Value], accept: impl Fn(&Value) -> bool) -> Vec<usize> {
    items
        .iter()
        .enumerate()
        .filter(|(_, item)| accept(item))
        .map(|(i, _)| i)
        .collect()
}

/// Where a run of equal-or-greater values starts in rank order.
fn count_below(items: &[Value], value: &Value) -> usize {
    items
        .iter()
        .filter(|item| value::compare(item, value) == Ordering::Less)
        .count()
}

/// Unordered lists' rank-space choices: EXISTS of the inverted rank ranges
/// asks whether nothing was chosen from a non-empty list.
fn by_rank(extent: Extent) -> Shape {
    Shape::new(Space::Rank, extent).exists(InvertedExists::NothingChosen)
}

/// EXISTS of the inverted value matches asks whether nothing was chosen at
/// all.
fn by_value(extent: Extent) -> Shape {
    Shape::new(Space::Rank, extent).exists(InvertedExists::NoMatch)
}

/// Inverted, an unordered list's rank-space choice is the stretch before it
/// and the one after, even when it chose nothing.
fn split(start: usize, end: usize) -> Extent {
    Extent::Range {
        start,
        end: end.max(start),
        split: true,
    }
}

/// In the value list's order: each value's matches (in index order, which
/// is their rank order). A value listed again finds its matches once more
/// on an ordered list (`repeat`); elsewhere only its last listing counts.
fn value_list_matches(
    items: &[Value],
    values: &[Value],
    ordered: bool,
    repeat: bool,
) -> Vec<usize> {
    let listed: Vec<&Value> = if ordered {
        values.iter().collect()
    } else {
        last_occurrences(values)
            .into_iter()
            .map(|i| &values[i])
            .collect()
    };
    let mut taken = vec![false; items.len()];
    let mut chosen = Vec::new();
    for value in listed {
        for (i, item) in items.iter().enumerate() {
            if ((repeat && ordered) || !taken[i]) && equal(item, value) {
                taken[i] = true;
                chosen.push(i);
            }
        }
    }
    chosen
}

/// The positions of the elements of ranks `start..end`: an ordered list's
/// own (rank is index there), an unordered list's as the reference's heap
/// picks them, in its order ([`heap_pick`]).
fn ranked(items: &[Value], ordered: bool, start: usize, end: usize) -> Vec<usize> {
    let end = end.min(items.len());
    if ordered {
        return (start.min(end)..end).collect();
    }
    let values: Vec<&Value> = items.iter().collect();
    heap_pick(&values, start, end.saturating_sub(start))
}

/// The rank range `[start, end)` of a relative rank range: `rank` counts
/// from the number of elements below `value`; a start before rank 0 is
/// clamped to 0, the count shrinking by as much.
fn relative_range(
    items: &[Value],
    value: &Value,
    rank: i64,
    count: Option<i64>,
) -> Result<(usize, usize), CdtError> {
    if count.is_some_and(|count| count < 0) {
        return Err(CdtError::Parameter);
    }
    let below = items
        .iter()
        .filter(|item| value::compare(item, value) == Ordering::Less)
        .count();
    let mut start = len_i64(below).saturating_add(rank);
    let mut count = count;
    if start < 0 {
        count = count.map(|count| count.saturating_add(start).max(0));
        start = 0;
    }
    range_of(start, count, items.len())
}

/// Puts the chosen elements in the order the reference lists them for
/// `rt` (module doc): index order by default; rank order for the values of
/// a rank range; ascending ranks for rank and value ranges; ascending
/// reverse indexes (and reverse ranks, on an `ordered` list) for index
/// ranges; the value list's order for a value list's ranks (and, on an
/// ordered list, for its indexes and values, each value's reverse numbers
/// ascending).
fn arrange(chosen: &mut [usize], rt: ReturnType, family: Family, ordered: bool, items: &[Value]) {
    enum Key {
        IndexAscending,
        IndexDescending,
        RankAscending,
        RankDescending,
    }
    let key = match (family, rt) {
        (_, ReturnType::None | ReturnType::Count | ReturnType::Exists) => return,
        // A value list's ranks, and on an ordered list its indexes and
        // values too, come in the value list's order (see `choose`).
        (Family::ValueList, ReturnType::ReverseIndex | ReturnType::ReverseRank) if ordered => {
            // Each value's matches are a stretch there: reversed numbers
            // ascend within it (the reference's).
            for group in chosen
                .chunk_by_mut(|&a, &b| value::compare(&items[a], &items[b]) == Ordering::Equal)
            {
                group.reverse();
            }
            return;
        }
        (Family::ValueList, ReturnType::Rank | ReturnType::ReverseRank) => return,
        (Family::ValueList, _) if ordered => return,
        (Family::IndexRange, ReturnType::ReverseIndex) => Key::IndexDescending,
        // On an ordered list ranks are indexes; on an unordered one the
        // reference lists an index range's ranks in index order.
        (Family::IndexRange, ReturnType::ReverseRank) if ordered => Key::IndexDescending,
        (Family::RankRange | Family::ValueMatch, ReturnType::Rank) => Key::RankAscending,
        (Family::RankRange | Family::ValueMatch, ReturnType::ReverseRank) => Key::RankDescending,
        (Family::RankRange, ReturnType::Value) if ordered => Key::RankAscending,
        // The reference picks an unordered list's rank range with a heap
        // and answers the values in the order it took them, which `choose`
        // kept ([`heap_pick`]).
        (Family::RankRange, ReturnType::Value) => return,
        _ => Key::IndexAscending,
    };
    match key {
        Key::IndexAscending => chosen.sort_unstable(),
        Key::IndexDescending => chosen.sort_unstable_by(|a, b| b.cmp(a)),
        Key::RankAscending | Key::RankDescending => {
            let ranks = ranks_of(items.iter());
            let rank = |i: usize| ranks.get(i).copied().unwrap_or(usize::MAX);
            if matches!(key, Key::RankDescending) {
                chosen.sort_unstable_by_key(|&i| std::cmp::Reverse(rank(i)));
            } else {
                chosen.sort_unstable_by_key(|&i| rank(i));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::code::*;
    use super::*;
    use crate::value::{to_bytes, Map};
    use CdtError::{ElementExists, IncompatibleType, OpNotApplicable, Parameter};

    // The remove twins, spelled out (the code derives them from the gets).
    const REMOVE_BY_VALUE: i64 = 33;
    const REMOVE_BY_RANK: i64 = 34;
    const REMOVE_ALL_BY_VALUE: i64 = 35;
    const REMOVE_ALL_BY_VALUE_LIST: i64 = 36;
    const REMOVE_BY_INDEX_RANGE: i64 = 37;
    const REMOVE_BY_VALUE_INTERVAL: i64 = 38;
    const REMOVE_BY_RANK_RANGE: i64 = 39;

    const RT_NONE: i64 = 0;
    const RT_INDEX: i64 = 1;
    const RT_REV_INDEX: i64 = 2;
    const RT_RANK: i64 = 3;
    const RT_REV_RANK: i64 = 4;
    const RT_COUNT: i64 = 5;
    const RT_KEY: i64 = 6;
    const RT_VALUE: i64 = 7;
    const RT_EXISTS: i64 = 13;
    const INV: i64 = 0x10000;

    const UNIQUE: i64 = ADD_UNIQUE as i64;
    const BOUNDED: i64 = INSERT_BOUNDED as i64;
    const FAIL_OFF: i64 = NO_FAIL as i64;
    const PART: i64 = PARTIAL as i64;

    fn int(i: i64) -> Value {
        Value::Int(i)
    }

    fn dbl(d: f64) -> Value {
        Value::Double(d)
    }

    fn s(text: &str) -> Value {
        Value::str(text)
    }

    fn nil() -> Value {
        Value::Nil
    }

    fn list_of(items: Vec<Value>) -> Value {
        Value::List(List { flags: 0, items })
    }

    fn list(items: &[i64]) -> Value {
        list_of(items.iter().copied().map(Value::Int).collect())
    }

    fn ordered(items: &[i64]) -> Value {
        Value::List(List {
            flags: LIST_ORDERED,
            items: items.iter().copied().map(Value::Int).collect(),
        })
    }

    fn bytes(value: &Option<Value>) -> Option<Vec<u8>> {
        value.as_ref().map(to_bytes)
    }

    /// Exact equality (types, flags and all), through the encoding.
    #[track_caller]
    fn same(actual: Option<Value>, expected: Option<Value>) {
        assert_eq!(
            bytes(&actual),
            bytes(&expected),
            "got {actual:?}, expected {expected:?}"
        );
    }

    /// A bin (or nested element) the ops run on.
    struct Bin(Option<Value>);

    impl Bin {
        fn new(value: Value) -> Bin {
            Bin(Some(value))
        }

        /// Runs an op that must succeed; returns its result.
        #[track_caller]
        fn ok(&mut self, code: i64, args: &[Value]) -> Option<Value> {
            match apply(code, args, &mut self.0) {
                Ok(result) => result,
                Err(error) => panic!("op {code} {args:?} failed: {error:?}"),
            }
        }

        /// Runs an op that must fail with `error` and change nothing.
        #[track_caller]
        fn fails(&mut self, code: i64, args: &[Value], error: CdtError) {
            let before = bytes(&self.0);
            assert_eq!(
                apply(code, args, &mut self.0),
                Err(error),
                "op {code} {args:?}"
            );
            assert_eq!(bytes(&self.0), before, "refused op {code} changed the list");
        }

        /// Checks the list now held.
        #[track_caller]
        fn holds(&self, expected: Value) {
            same(self.0.clone(), Some(expected));
        }
    }

    /// A read's result on `value`; checks the read changed nothing.
    #[track_caller]
    fn read(value: &Value, code: i64, args: &[Value]) -> Option<Value> {
        let mut bin = Bin::new(value.clone());
        let result = bin.ok(code, args);
        bin.holds(value.clone());
        result
    }

    #[test]
    fn op_codes_classify() {
        for code in 0..=13 {
            assert_eq!(is_modify(code), Some(true), "{code}");
        }
        for code in 16..=27 {
            assert_eq!(is_modify(code), Some(false), "{code}");
        }
        for code in 32..=40 {
            assert_eq!(is_modify(code), Some(true), "{code}");
        }
        for code in [-1, 14, 15, 28, 31, 41, 63, 64, 127, 255] {
            assert_eq!(is_modify(code), None, "{code}");
        }
        let mut bin = Bin::new(list(&[1]));
        bin.fails(14, &[], Parameter);
        bin.fails(64, &[], Parameter);
    }

    #[test]
    fn a_non_list_is_incompatible() {
        let map = Value::Map(Map {
            flags: 0,
            entries: vec![(int(1), int(2))],
        });
        for value in [int(5), s("x"), map] {
            let mut bin = Bin::new(value);
            bin.fails(APPEND, &[int(1)], IncompatibleType);
            bin.fails(SIZE, &[], IncompatibleType);
            bin.fails(GET, &[int(0)], IncompatibleType);
            bin.fails(REMOVE_BY_INDEX, &[int(RT_VALUE), int(0)], IncompatibleType);
            bin.fails(CLEAR, &[], IncompatibleType);
            bin.fails(SET_TYPE, &[int(1)], IncompatibleType);
        }
    }

    #[test]
    fn writes_create_a_missing_list() {
        let mut bin = Bin(None);
        same(bin.ok(APPEND, &[s("x")]), Some(int(1)));
        bin.holds(list_of(vec![s("x")]));

        // The order attribute decides whether the new list is ordered.
        let mut bin = Bin(None);
        same(
            bin.ok(APPEND_ITEMS, &[list(&[3, 1, 2]), int(1)]),
            Some(int(3)),
        );
        bin.holds(ordered(&[1, 2, 3]));
        let mut bin = Bin(None);
        same(bin.ok(APPEND, &[int(4), int(0x40)]), Some(int(1)));
        bin.holds(list(&[4]));
        let mut bin = Bin(None);
        same(bin.ok(APPEND_ITEMS, &[list(&[])]), Some(int(0)));
        bin.holds(list(&[]));

        let padded = list_of(vec![nil(), nil(), s("v")]);
        let mut bin = Bin(None);
        same(bin.ok(INSERT, &[int(2), s("v")]), Some(int(3)));
        bin.holds(padded.clone());
        let mut bin = Bin(None);
        same(bin.ok(SET, &[int(2), s("v")]), None);
        bin.holds(padded);

        let mut bin = Bin(None);
        same(bin.ok(INCREMENT, &[int(0)]), Some(int(1)));
        bin.holds(list(&[1]));
        let mut bin = Bin(None);
        same(bin.ok(INCREMENT, &[int(1), dbl(2.5)]), Some(dbl(2.5)));
        bin.holds(list_of(vec![nil(), dbl(2.5)]));
        let mut bin = Bin(None);
        same(bin.ok(INCREMENT, &[int(0), int(5), int(1)]), Some(int(5)));
        bin.holds(ordered(&[5]));

        let mut bin = Bin(None);
        same(bin.ok(SET_TYPE, &[int(1)]), None);
        bin.holds(ordered(&[]));

        // A refused write creates nothing.
        let mut bin = Bin(None);
        bin.fails(APPEND, &[Value::Wildcard], Parameter);
        bin.fails(APPEND, &[int(1), s("attr")], Parameter);
        bin.fails(INSERT, &[int(-1), int(1)], OpNotApplicable);
        bin.fails(SET_TYPE, &[int(4)], OpNotApplicable);
        assert!(bin.0.is_none());
    }

    #[test]
    fn removes_and_reads_on_a_missing_list_do_nothing() {
        let ops: [(i64, &[Value]); 11] = [
            (POP, &[int(0)]),
            (POP_RANGE, &[int(0), int(2)]),
            (REMOVE, &[int(0)]),
            (REMOVE_RANGE, &[int(0)]),
            (TRIM, &[int(0), int(1)]),
            (CLEAR, &[]),
            (REMOVE_BY_INDEX, &[int(RT_VALUE), int(0)]),
            (REMOVE_BY_VALUE_INTERVAL, &[int(RT_COUNT), nil()]),
            (SIZE, &[]),
            (GET, &[int(0)]),
            (GET_BY_RANK_RANGE, &[int(RT_VALUE), int(0)]),
        ];
        for (code, args) in ops {
            let mut bin = Bin(None);
            same(bin.ok(code, args), None);
            assert!(bin.0.is_none(), "{code}");
        }
        Bin(None).fails(SORT, &[int(0)], IncompatibleType);
    }

    #[test]
    fn set_type_orders_and_unorders() {
        let mut bin = Bin::new(list(&[3, 1, 2]));
        same(bin.ok(SET_TYPE, &[int(1)]), None);
        bin.holds(ordered(&[1, 2, 3]));
        bin.ok(SET_TYPE, &[int(0)]);
        bin.holds(list(&[1, 2, 3]));
        bin.ok(SET_TYPE, &[int(0x11)]);
        bin.holds(Value::List(List {
            flags: LIST_ORDERED | PERSIST_INDEX,
            items: vec![int(1), int(2), int(3)],
        }));
        bin.fails(SET_TYPE, &[int(2)], OpNotApplicable);
        bin.fails(SET_TYPE, &[int(-1)], OpNotApplicable);
        bin.fails(SET_TYPE, &[], Parameter);
        bin.fails(SET_TYPE, &[int(1), int(1)], Parameter);
        bin.fails(SET_TYPE, &[s("ordered")], Parameter);
    }

    #[test]
    fn append_and_insert_answer_the_new_size() {
        let mut bin = Bin::new(list(&[1, 2, 3]));
        same(bin.ok(APPEND, &[int(4)]), Some(int(4)));
        same(bin.ok(APPEND_ITEMS, &[list(&[5, 6])]), Some(int(6)));
        same(bin.ok(INSERT, &[int(0), int(0)]), Some(int(7)));
        bin.holds(list(&[0, 1, 2, 3, 4, 5, 6]));
        same(bin.ok(INSERT, &[int(-1), int(9)]), Some(int(8)));
        bin.holds(list(&[0, 1, 2, 3, 4, 5, 9, 6]));
        same(bin.ok(INSERT, &[int(8), int(7)]), Some(int(9)));
        same(bin.ok(INSERT, &[int(-9), int(8)]), Some(int(10)));
        bin.holds(list(&[8, 0, 1, 2, 3, 4, 5, 9, 6, 7]));

        let mut bin = Bin::new(list(&[1, 2]));
        same(
            bin.ok(INSERT_ITEMS, &[int(1), list_of(vec![s("a"), s("b")])]),
            Some(int(4)),
        );
        bin.holds(list_of(vec![int(1), s("a"), s("b"), int(2)]));

        // Past the end pads with nils.
        let mut bin = Bin::new(list(&[1]));
        same(bin.ok(INSERT_ITEMS, &[int(3), list(&[2, 3])]), Some(int(5)));
        bin.holds(list_of(vec![int(1), nil(), nil(), int(2), int(3)]));

        // Before the start, or absurdly far past the end, is refused.
        let mut bin = Bin::new(list(&[1, 2]));
        bin.fails(INSERT, &[int(-3), int(0)], OpNotApplicable);
        bin.fails(INSERT, &[int(i64::MIN), int(0)], OpNotApplicable);
        bin.fails(
            INSERT,
            &[int(i64::from(i32::MAX) + 1), int(0)],
            OpNotApplicable,
        );
        let far = int(i64::try_from(MAX_PADDING).unwrap_or(i64::MAX) + 3);
        bin.fails(INSERT, &[far.clone(), int(0)], OpNotApplicable);
        bin.fails(SET, &[far, int(0)], OpNotApplicable);

        // An empty item list changes nothing, wherever it goes.
        same(bin.ok(INSERT_ITEMS, &[int(-50), list(&[])]), Some(int(2)));
        bin.holds(list(&[1, 2]));
    }

    #[test]
    fn stored_values_must_be_values() {
        let mut bin = Bin::new(list(&[1]));
        let nested_wildcard = list_of(vec![int(1), list_of(vec![Value::Wildcard])]);
        let infinity_in_map = Value::Map(Map {
            flags: 0,
            entries: vec![(int(1), Value::Infinity)],
        });
        bin.fails(APPEND, &[Value::Wildcard], Parameter);
        bin.fails(APPEND, std::slice::from_ref(&infinity_in_map), Parameter);
        bin.fails(APPEND_ITEMS, &[nested_wildcard], Parameter);
        bin.fails(APPEND_ITEMS, &[int(1)], Parameter);
        bin.fails(INSERT, &[int(0), Value::Infinity], Parameter);
        bin.fails(INSERT_ITEMS, &[int(0), s("not a list")], Parameter);
        bin.fails(SET, &[int(0), list_of(vec![infinity_in_map])], Parameter);
        bin.fails(SET, &[int(0), Value::Ext(0xff, vec![0])], Parameter);
        // Other exts are ordinary values.
        same(bin.ok(SET, &[int(0), Value::Ext(7, vec![1, 2])]), None);
        bin.holds(list_of(vec![Value::Ext(7, vec![1, 2])]));
    }

    #[test]
    fn argument_shapes_are_checked() {
        let mut bin = Bin::new(list(&[1, 2, 3]));
        bin.fails(APPEND, &[], Parameter);
        bin.fails(APPEND, &[int(1), int(0), int(0), int(0)], Parameter);
        bin.fails(APPEND, &[int(1), int(0), s("flags")], Parameter);
        bin.fails(INSERT, &[s("0"), int(1)], Parameter);
        bin.fails(INSERT, &[int(0)], Parameter);
        bin.fails(POP, &[], Parameter);
        bin.fails(POP, &[dbl(0.0)], Parameter);
        bin.fails(POP_RANGE, &[int(0), s("2")], Parameter);
        bin.fails(TRIM, &[int(0)], Parameter);
        bin.fails(GET, &[int(0), int(1)], Parameter);
        bin.fails(SORT, &[int(0), int(0)], Parameter);
        bin.fails(SORT, &[nil()], Parameter);
        bin.fails(GET_BY_INDEX, &[int(RT_VALUE)], Parameter);
        bin.fails(GET_BY_INDEX, &[int(RT_VALUE), int(0), int(1)], Parameter);
        bin.fails(GET_BY_INDEX, &[s("rt"), int(0)], Parameter);
        // A return type the server does not know cannot apply (26).
        bin.fails(GET_BY_INDEX, &[int(14), int(0)], OpNotApplicable);
        bin.fails(GET_BY_INDEX_RANGE, &[int(42), int(0)], OpNotApplicable);
        bin.fails(
            REMOVE_BY_RANK_RANGE,
            &[int(INV | 42), int(0)],
            OpNotApplicable,
        );
        bin.fails(
            GET_BY_INDEX_RANGE,
            &[int(RT_VALUE), int(0), nil()],
            Parameter,
        );
        bin.fails(GET_ALL_BY_VALUE_LIST, &[int(RT_VALUE), int(1)], Parameter);
        bin.fails(
            GET_BY_VALUE_REL_RANK_RANGE,
            &[int(RT_VALUE), int(1)],
            Parameter,
        );
        // Map return types do not apply to lists.
        bin.fails(GET_BY_INDEX, &[int(RT_KEY), int(0)], OpNotApplicable);
        bin.fails(REMOVE_BY_VALUE, &[int(8), int(1)], OpNotApplicable);
        // Ops without parameters ignore extra arguments, as the reference.
        same(bin.ok(SIZE, &[int(1)]), Some(int(3)));
    }

    #[test]
    fn ordered_lists_take_values_in_order() {
        let mut bin = Bin::new(ordered(&[2, 4]));
        same(bin.ok(APPEND, &[int(3)]), Some(int(3)));
        bin.holds(ordered(&[2, 3, 4]));
        same(bin.ok(APPEND_ITEMS, &[list(&[5, 1, 3])]), Some(int(6)));
        bin.holds(ordered(&[1, 2, 3, 3, 4, 5]));
        bin.fails(INSERT, &[int(0), int(0)], OpNotApplicable);
        bin.fails(INSERT_ITEMS, &[int(0), list(&[0])], OpNotApplicable);
        bin.fails(SET, &[int(0), int(0)], OpNotApplicable);
        same(bin.ok(POP, &[int(0)]), Some(int(1)));
        same(bin.ok(CLEAR, &[]), None);
        bin.holds(ordered(&[]));
    }

    #[test]
    fn add_unique_refuses_duplicates() {
        let unique = int(UNIQUE);
        let no_fail = int(UNIQUE | FAIL_OFF);
        let partial = int(UNIQUE | FAIL_OFF | PART);

        let mut bin = Bin::new(list(&[1, 2]));
        bin.fails(APPEND, &[int(2), int(0), unique.clone()], ElementExists);
        same(
            bin.ok(APPEND, &[int(2), int(0), no_fail.clone()]),
            Some(int(2)),
        );
        bin.holds(list(&[1, 2]));
        same(
            bin.ok(APPEND, &[int(3), int(0), unique.clone()]),
            Some(int(3)),
        );
        bin.fails(INSERT, &[int(0), int(3), unique.clone()], ElementExists);

        let mut bin = Bin::new(list(&[1, 2]));
        let items = list(&[3, 2, 4]);
        bin.fails(
            APPEND_ITEMS,
            &[items.clone(), int(0), unique.clone()],
            ElementExists,
        );
        // PARTIAL only counts with NO_FAIL.
        bin.fails(
            APPEND_ITEMS,
            &[items.clone(), int(0), int(UNIQUE | PART)],
            ElementExists,
        );
        same(
            bin.ok(APPEND_ITEMS, &[items.clone(), int(0), no_fail.clone()]),
            Some(int(2)),
        );
        bin.holds(list(&[1, 2]));
        same(
            bin.ok(APPEND_ITEMS, &[items, int(0), partial.clone()]),
            Some(int(4)),
        );
        bin.holds(list(&[1, 2, 3, 4]));

        // A repeat among the items themselves.
        let mut bin = Bin::new(list(&[1]));
        let repeated = list(&[5, 6, 5]);
        bin.fails(
            APPEND_ITEMS,
            &[repeated.clone(), int(0), unique.clone()],
            OpNotApplicable,
        );
        same(
            bin.ok(APPEND_ITEMS, &[repeated.clone(), int(0), no_fail]),
            Some(int(1)),
        );
        bin.holds(list(&[1]));
        same(
            bin.ok(INSERT_ITEMS, &[int(0), repeated, partial.clone()]),
            Some(int(3)),
        );
        bin.holds(list(&[5, 6, 1]));

        // Every item refused under PARTIAL: nothing to do, no error.
        let mut bin = Bin::new(list(&[1, 2]));
        same(
            bin.ok(APPEND_ITEMS, &[list(&[2, 1]), int(0), partial.clone()]),
            Some(int(2)),
        );
        bin.holds(list(&[1, 2]));

        // Ordered lists.
        let mut bin = Bin::new(ordered(&[1, 3]));
        bin.fails(APPEND, &[int(3), int(1), unique.clone()], ElementExists);
        bin.fails(
            APPEND_ITEMS,
            &[list(&[4, 4]), int(1), unique.clone()],
            OpNotApplicable,
        );
        bin.fails(
            APPEND_ITEMS,
            &[list(&[0, 3]), int(1), unique],
            ElementExists,
        );
        same(
            bin.ok(APPEND_ITEMS, &[list(&[4, 3, 0, 4]), int(1), partial]),
            Some(int(4)),
        );
        bin.holds(ordered(&[0, 1, 3, 4]));
    }

    #[test]
    fn set_with_add_unique_looks_at_the_other_elements() {
        let mut bin = Bin::new(list(&[1, 2, 3]));
        bin.fails(SET, &[int(0), int(2), int(UNIQUE)], ElementExists);
        same(bin.ok(SET, &[int(1), int(2), int(UNIQUE)]), None);
        bin.holds(list(&[1, 2, 3]));
        same(bin.ok(SET, &[int(1), int(5), int(UNIQUE)]), None);
        bin.holds(list(&[1, 5, 3]));
        same(bin.ok(SET, &[int(0), int(3), int(UNIQUE | FAIL_OFF)]), None);
        bin.holds(list(&[1, 5, 3]));
    }

    #[test]
    fn insert_bounded_refuses_past_the_end() {
        let bounded = int(BOUNDED);
        let no_fail = int(BOUNDED | FAIL_OFF);
        let mut bin = Bin::new(list(&[1, 2]));
        bin.fails(INSERT, &[int(3), int(9), bounded.clone()], OpNotApplicable);
        bin.fails(
            INSERT_ITEMS,
            &[int(3), list(&[9]), bounded.clone()],
            OpNotApplicable,
        );
        bin.fails(SET, &[int(3), int(9), bounded.clone()], OpNotApplicable);
        bin.fails(
            INCREMENT,
            &[int(3), int(9), int(0), bounded.clone()],
            OpNotApplicable,
        );
        same(
            bin.ok(INSERT, &[int(3), int(9), no_fail.clone()]),
            Some(int(2)),
        );
        same(bin.ok(SET, &[int(5), int(9), no_fail]), None);
        bin.holds(list(&[1, 2]));
        // At the end is within bounds; so is setting an existing element.
        same(
            bin.ok(INSERT, &[int(2), int(3), bounded.clone()]),
            Some(int(3)),
        );
        same(bin.ok(SET, &[int(-1), int(4), bounded.clone()]), None);
        same(bin.ok(APPEND, &[int(5), int(0), bounded]), Some(int(4)));
        bin.holds(list(&[1, 2, 4, 5]));
    }

    #[test]
    fn set_replaces_or_pads() {
        let mut bin = Bin::new(list(&[1, 2, 3]));
        same(bin.ok(SET, &[int(0), s("a")]), None);
        same(bin.ok(SET, &[int(-1), s("z")]), None);
        bin.holds(list_of(vec![s("a"), int(2), s("z")]));
        same(bin.ok(SET, &[int(4), int(5)]), None);
        bin.holds(list_of(vec![s("a"), int(2), s("z"), nil(), int(5)]));
        bin.fails(SET, &[int(-6), int(0)], OpNotApplicable);
        bin.fails(SET, &[int(0)], Parameter);
    }

    #[test]
    fn increment_adds_in_the_element_type() {
        let mut bin = Bin::new(list_of(vec![int(1), dbl(2.5), s("s")]));
        same(bin.ok(INCREMENT, &[int(0), int(41)]), Some(int(42)));
        same(bin.ok(INCREMENT, &[int(0)]), Some(int(43)));
        same(bin.ok(INCREMENT, &[int(0), nil()]), Some(int(44)));
        // A float delta on an integer is truncated; an integer on a float
        // is widened.
        same(bin.ok(INCREMENT, &[int(-3), dbl(1.9)]), Some(int(45)));
        same(bin.ok(INCREMENT, &[int(1), int(2)]), Some(dbl(4.5)));
        same(bin.ok(INCREMENT, &[int(1), dbl(0.25)]), Some(dbl(4.75)));
        bin.holds(list_of(vec![int(45), dbl(4.75), s("s")]));
        // Refusals leave the list alone.
        bin.fails(INCREMENT, &[int(2), int(1)], Parameter);
        bin.fails(INCREMENT, &[int(0), s("1")], Parameter);
        bin.fails(INCREMENT, &[int(-4), int(1)], OpNotApplicable);
        // The index is checked before the delta.
        bin.fails(INCREMENT, &[int(-4), s("1")], OpNotApplicable);
        bin.fails(INCREMENT, &[], Parameter);
        bin.fails(INCREMENT, &[int(0), int(1), s("attr")], Parameter);

        // Past the end: the delta, padded.
        let mut bin = Bin::new(list(&[1]));
        same(bin.ok(INCREMENT, &[int(2), int(7)]), Some(int(7)));
        bin.holds(list_of(vec![int(1), nil(), int(7)]));

        // Overflow wraps, as the reference's 64-bit add.
        let mut bin = Bin::new(list(&[i64::MAX]));
        same(bin.ok(INCREMENT, &[int(0), int(1)]), Some(int(i64::MIN)));
        bin.holds(list(&[i64::MIN]));
    }

    #[test]
    fn increment_keeps_an_ordered_list_sorted() {
        let mut bin = Bin::new(ordered(&[1, 5, 9]));
        same(bin.ok(INCREMENT, &[int(0), int(6)]), Some(int(7)));
        bin.holds(ordered(&[5, 7, 9]));
        same(bin.ok(INCREMENT, &[int(3), int(4)]), Some(int(4)));
        bin.holds(ordered(&[4, 5, 7, 9]));
        bin.fails(INCREMENT, &[int(5), int(1)], OpNotApplicable);
        bin.fails(
            INCREMENT,
            &[int(0), int(1), int(1), int(UNIQUE)],
            ElementExists,
        );
        // Adding nothing under ADD_UNIQUE finds the element itself: no-op.
        same(
            bin.ok(INCREMENT, &[int(0), int(0), int(1), int(UNIQUE)]),
            Some(int(4)),
        );
        bin.holds(ordered(&[4, 5, 7, 9]));
    }

    #[test]
    fn pop_remove_trim_and_clear() {
        let mut bin = Bin::new(list(&[10, 20, 30, 40, 50, 60]));
        same(bin.ok(POP, &[int(0)]), Some(int(10)));
        same(bin.ok(POP_RANGE, &[int(-2), int(2)]), Some(list(&[50, 60])));
        same(bin.ok(REMOVE, &[int(-1)]), Some(int(1)));
        bin.holds(list(&[20, 30]));
        bin.fails(POP, &[int(2)], OpNotApplicable);
        bin.fails(REMOVE, &[int(-3)], OpNotApplicable);
        same(bin.ok(POP_RANGE, &[int(5), int(2)]), Some(list(&[])));
        same(bin.ok(REMOVE_RANGE, &[int(0), int(0)]), Some(int(0)));
        bin.holds(list(&[20, 30]));
        same(bin.ok(REMOVE_RANGE, &[int(1)]), Some(int(1)));
        bin.holds(list(&[20]));
        same(bin.ok(CLEAR, &[]), None);
        bin.holds(list(&[]));

        let mut bin = Bin::new(list(&[1, 2, 3, 4, 5, 6]));
        same(bin.ok(TRIM, &[int(1), int(2)]), Some(int(4)));
        bin.holds(list(&[2, 3]));
        let mut bin = Bin::new(list(&[1, 2, 3, 4, 5, 6]));
        same(bin.ok(TRIM, &[int(-2), int(10)]), Some(int(4)));
        bin.holds(list(&[5, 6]));
        let mut bin = Bin::new(list(&[1, 2, 3]));
        same(bin.ok(TRIM, &[int(3), int(1)]), Some(int(3)));
        bin.holds(list(&[]));

        let mut bin = Bin::new(list(&[1, 2, 3]));
        // A negative count is a huge unsigned one on the wire: to the end.
        let mut probe = Bin::new(list(&[1, 2, 3]));
        same(probe.ok(TRIM, &[int(0), int(-1)]), Some(int(0)));
        same(probe.ok(POP_RANGE, &[int(1), int(-1)]), Some(list(&[2, 3])));
        same(
            probe.ok(REMOVE_BY_RANK_RANGE, &[int(RT_VALUE), int(0), int(-1)]),
            Some(list(&[1])),
        );
        probe.holds(list(&[]));
        // A count too large for an i64 reaches the end.
        same(
            bin.ok(REMOVE_RANGE, &[int(1), Value::UInt(u64::MAX)]),
            Some(int(2)),
        );
        bin.holds(list(&[1]));
    }

    #[test]
    fn sort_orders_and_drops_duplicates() {
        let items = list(&[3, 1, 2, 1]);
        for (flags, expected) in [
            (None, list(&[1, 1, 2, 3])),
            (Some(0), list(&[1, 1, 2, 3])),
            (Some(1), list(&[3, 2, 1, 1])),
            (Some(2), list(&[1, 2, 3])),
            (Some(3), list(&[3, 2, 1])),
        ] {
            let mut bin = Bin::new(items.clone());
            let args: Vec<Value> = flags.into_iter().map(int).collect();
            same(bin.ok(SORT, &args), None);
            bin.holds(expected);
        }
        // An ordered list keeps its order; duplicates can still go.
        let mut bin = Bin::new(ordered(&[1, 1, 2]));
        bin.ok(SORT, &[int(1)]);
        bin.holds(ordered(&[1, 1, 2]));
        bin.ok(SORT, &[int(3)]);
        bin.holds(ordered(&[1, 2]));
        // Mixed types sort in the reference order.
        let mut bin = Bin::new(list_of(vec![
            s("b"),
            dbl(1.0),
            int(2),
            nil(),
            s("a"),
            Value::Bool(true),
        ]));
        bin.ok(SORT, &[]);
        bin.holds(list_of(vec![
            nil(),
            Value::Bool(true),
            int(2),
            s("a"),
            s("b"),
            dbl(1.0),
        ]));
    }

    #[test]
    fn size_get_and_get_range() {
        let items = list(&[1, 2, 3, 4, 5]);
        same(read(&items, SIZE, &[]), Some(int(5)));
        same(read(&list(&[]), SIZE, &[]), Some(int(0)));
        same(read(&items, GET, &[int(-1)]), Some(int(5)));
        same(
            read(&items, GET_RANGE, &[int(1), int(3)]),
            Some(list(&[2, 3, 4])),
        );
        same(read(&items, GET_RANGE, &[int(3)]), Some(list(&[4, 5])));
        // Clamping: a start before the list shrinks the count by as much.
        same(
            read(&items, GET_RANGE, &[int(-6), int(3)]),
            Some(list(&[1, 2])),
        );
        same(
            read(&items, GET_RANGE, &[int(-10), int(3)]),
            Some(list(&[])),
        );
        same(read(&items, GET_RANGE, &[int(-10)]), Some(items.clone()));
        same(read(&items, GET_RANGE, &[int(9), int(3)]), Some(list(&[])));
        let mut bin = Bin::new(items);
        bin.fails(GET, &[int(5)], OpNotApplicable);
        bin.fails(GET, &[int(-6)], OpNotApplicable);
        Bin::new(list(&[])).fails(GET, &[int(0)], OpNotApplicable);
    }

    /// The unordered list the selector tests share: values 7 3 9 3 1 at
    /// indexes 0..5, ranks (ties by index) 3 1 4 2 0.
    fn l() -> Value {
        list(&[7, 3, 9, 3, 1])
    }

    /// The same values, ordered: 1 3 3 7 9.
    fn o() -> Value {
        ordered(&[1, 3, 3, 7, 9])
    }

    #[test]
    fn by_index_answers_each_return_type() {
        let by_index = |rt: i64, index: i64| read(&l(), GET_BY_INDEX, &[int(rt), int(index)]);
        same(by_index(RT_NONE, 1), None);
        same(by_index(RT_INDEX, 1), Some(int(1)));
        same(by_index(RT_REV_INDEX, 1), Some(int(3)));
        same(by_index(RT_RANK, 1), Some(int(1)));
        same(by_index(RT_REV_RANK, 1), Some(int(3)));
        same(by_index(RT_COUNT, 1), Some(int(1)));
        same(by_index(RT_VALUE, 1), Some(int(3)));
        same(by_index(RT_EXISTS, 1), Some(Value::Bool(true)));
        same(by_index(RT_VALUE, -1), Some(int(1)));
        let mut bin = Bin::new(l());
        bin.fails(GET_BY_INDEX, &[int(RT_VALUE), int(5)], OpNotApplicable);
        bin.fails(
            GET_BY_INDEX,
            &[int(RT_VALUE | INV), int(0)],
            OpNotApplicable,
        );
        bin.fails(REMOVE_BY_INDEX, &[int(RT_VALUE), int(-6)], OpNotApplicable);
        same(
            bin.ok(REMOVE_BY_INDEX, &[int(RT_REV_INDEX), int(-2)]),
            Some(int(1)),
        );
        bin.holds(list(&[7, 3, 9, 1]));
    }

    #[test]
    fn by_rank_and_single_value() {
        same(
            read(&l(), GET_BY_RANK, &[int(RT_VALUE), int(0)]),
            Some(int(1)),
        );
        same(
            read(&l(), GET_BY_RANK, &[int(RT_INDEX), int(-1)]),
            Some(int(2)),
        );
        same(
            read(&l(), GET_BY_RANK, &[int(RT_RANK), int(2)]),
            Some(int(2)),
        );
        same(
            read(&l(), GET_BY_RANK, &[int(RT_REV_INDEX), int(2)]),
            Some(int(1)),
        );
        same(
            read(&o(), GET_BY_RANK, &[int(RT_INDEX), int(-2)]),
            Some(int(3)),
        );
        let mut bin = Bin::new(l());
        bin.fails(GET_BY_RANK, &[int(RT_VALUE), int(5)], OpNotApplicable);
        bin.fails(GET_BY_RANK, &[int(RT_VALUE | INV), int(0)], OpNotApplicable);

        // Code 20: the first element equal to the value.
        let by_value = |rt: i64, value: i64| read(&l(), GET_BY_VALUE, &[int(rt), int(value)]);
        same(by_value(RT_INDEX, 3), Some(int(1)));
        same(by_value(RT_VALUE, 3), Some(int(3)));
        same(by_value(RT_COUNT, 3), Some(int(1)));
        same(by_value(RT_RANK, 3), Some(int(1)));
        // Not found.
        same(by_value(RT_INDEX, 4), Some(int(-1)));
        same(by_value(RT_REV_RANK, 4), Some(int(-1)));
        same(by_value(RT_VALUE, 4), None);
        same(by_value(RT_COUNT, 4), Some(int(0)));
        same(by_value(RT_EXISTS, 4), Some(Value::Bool(false)));
        bin.fails(
            GET_BY_VALUE,
            &[int(RT_INDEX | INV), int(3)],
            OpNotApplicable,
        );

        same(
            bin.ok(REMOVE_BY_VALUE, &[int(RT_INDEX), int(3)]),
            Some(int(1)),
        );
        bin.holds(list(&[7, 9, 3, 1]));
        same(
            bin.ok(REMOVE_BY_RANK, &[int(RT_VALUE), int(-1)]),
            Some(int(9)),
        );
        bin.holds(list(&[7, 3, 1]));
    }

    #[test]
    fn all_by_value_and_value_list() {
        let all = |rt: i64, value: i64| read(&l(), GET_ALL_BY_VALUE, &[int(rt), int(value)]);
        same(all(RT_INDEX, 3), Some(list(&[1, 3])));
        same(all(RT_REV_INDEX, 3), Some(list(&[3, 1])));
        same(all(RT_RANK, 3), Some(list(&[1, 2])));
        same(all(RT_REV_RANK, 3), Some(list(&[2, 3])));
        same(all(RT_COUNT, 3), Some(int(2)));
        same(all(RT_VALUE, 3), Some(list(&[3, 3])));
        same(all(RT_EXISTS, 3), Some(Value::Bool(true)));
        same(all(RT_INDEX | INV, 3), Some(list(&[0, 2, 4])));
        same(all(RT_VALUE | INV, 3), Some(list(&[7, 9, 1])));
        same(all(RT_INDEX, 4), Some(list(&[])));
        same(all(RT_VALUE, 4), Some(list(&[])));
        same(all(RT_EXISTS, 4), Some(Value::Bool(false)));
        same(all(RT_COUNT | INV, 4), Some(int(5)));

        let by_list =
            |rt: i64, values: &[i64]| read(&l(), GET_ALL_BY_VALUE_LIST, &[int(rt), list(values)]);
        same(by_list(RT_VALUE, &[3, 9, 42]), Some(list(&[3, 9, 3])));
        same(by_list(RT_INDEX, &[9, 3]), Some(list(&[1, 2, 3])));
        same(by_list(RT_VALUE | INV, &[3, 9]), Some(list(&[7, 1])));
        same(by_list(RT_VALUE, &[]), Some(list(&[])));
        same(by_list(RT_COUNT | INV, &[]), Some(int(5)));
        // Ranks follow the value list, a value listed again at its last
        // listing (the reference, 8.1.2; the official C client's suite
        // expects the first): 9 is rank 4, the 3s ranks 1 and 2; what a
        // value list leaves out comes in ascending rank.
        same(by_list(RT_RANK, &[9, 3, 9]), Some(list(&[1, 2, 4])));
        same(by_list(RT_RANK, &[9, 3]), Some(list(&[4, 1, 2])));
        same(by_list(RT_REV_RANK, &[9, 3]), Some(list(&[0, 3, 2])));
        same(by_list(RT_RANK | INV, &[9, 3]), Some(list(&[0, 3])));
        let unordered = list(&[4, 3, 1, 5, 2]);
        same(
            read(
                &unordered,
                GET_ALL_BY_VALUE_LIST,
                &[int(RT_RANK | INV), list(&[4, 2])],
            ),
            Some(list(&[0, 2, 4])),
        );
        // On an ordered list indexes and values follow the value list too.
        let sorted = ordered(&[1, 2, 3, 4]);
        let by_sorted = |rt: i64, values: &[i64]| {
            read(&sorted, GET_ALL_BY_VALUE_LIST, &[int(rt), list(values)])
        };
        same(by_sorted(RT_RANK, &[4, 2]), Some(list(&[3, 1])));
        same(by_sorted(RT_INDEX, &[4, 2]), Some(list(&[3, 1])));
        same(by_sorted(RT_VALUE, &[4, 2]), Some(list(&[4, 2])));
        same(by_sorted(RT_INDEX | INV, &[4, 2]), Some(list(&[0, 2])));
        same(by_sorted(RT_COUNT, &[4, 2, 4]), Some(int(2)));

        let mut bin = Bin::new(list(&[1, 2, 1, 3, 1]));
        same(
            bin.ok(REMOVE_ALL_BY_VALUE, &[int(RT_COUNT), int(1)]),
            Some(int(3)),
        );
        bin.holds(list(&[2, 3]));
        let mut bin = Bin::new(l());
        same(
            bin.ok(REMOVE_ALL_BY_VALUE_LIST, &[int(RT_NONE), list(&[7, 1])]),
            None,
        );
        bin.holds(list(&[3, 9, 3]));
        same(
            bin.ok(REMOVE_ALL_BY_VALUE_LIST, &[int(RT_VALUE | INV), list(&[3])]),
            Some(list(&[9])),
        );
        bin.holds(list(&[3, 3]));
    }

    #[test]
    fn wildcards_match_inside_values() {
        let pair = |n: i64, t: &str| list_of(vec![int(n), s(t)]);
        let mut bin = Bin::new(list_of(vec![pair(1, "a"), pair(2, "b"), pair(1, "c")]));
        let pattern = list_of(vec![int(1), Value::Wildcard]);
        same(
            bin.ok(GET_ALL_BY_VALUE, &[int(RT_INDEX), pattern.clone()]),
            Some(list(&[0, 2])),
        );
        same(
            bin.ok(REMOVE_ALL_BY_VALUE, &[int(RT_COUNT), pattern]),
            Some(int(2)),
        );
        bin.holds(list_of(vec![pair(2, "b")]));
    }

    #[test]
    fn index_ranges() {
        let range = |rt: i64, args: &[i64]| {
            let mut all = vec![int(rt)];
            all.extend(args.iter().copied().map(int));
            read(&l(), GET_BY_INDEX_RANGE, &all)
        };
        same(range(RT_VALUE, &[1, 2]), Some(list(&[3, 9])));
        same(range(RT_VALUE | INV, &[1, 2]), Some(list(&[7, 3, 1])));
        same(range(RT_INDEX, &[1, 2]), Some(list(&[1, 2])));
        // Reverse indexes ascending, as the reference lists a range.
        same(range(RT_REV_INDEX, &[1, 2]), Some(list(&[2, 3])));
        // An unordered list's ranks in index order.
        same(range(RT_RANK, &[1, 2]), Some(list(&[1, 4])));
        same(range(RT_REV_RANK, &[1, 2]), Some(list(&[3, 0])));
        same(range(RT_COUNT, &[1, 2]), Some(int(2)));
        same(range(RT_EXISTS, &[1, 0]), Some(Value::Bool(false)));
        same(range(RT_VALUE, &[-2]), Some(list(&[3, 1])));
        same(range(RT_VALUE, &[2]), Some(list(&[9, 3, 1])));
        same(range(RT_VALUE, &[7, 1]), Some(list(&[])));
        same(range(RT_INDEX, &[-7, 3]), Some(list(&[0])));
        same(range(RT_INDEX | INV, &[-7, 3]), Some(list(&[1, 2, 3, 4])));
        same(range(RT_NONE, &[0]), None);
        // On an ordered list ranks are indexes.
        same(
            read(
                &o(),
                GET_BY_INDEX_RANGE,
                &[int(RT_REV_RANK), int(0), int(2)],
            ),
            Some(list(&[3, 4])),
        );

        let mut bin = Bin::new(l());
        same(
            bin.ok(REMOVE_BY_INDEX_RANGE, &[int(RT_VALUE), int(1), int(2)]),
            Some(list(&[3, 9])),
        );
        bin.holds(list(&[7, 3, 1]));
        same(
            bin.ok(
                REMOVE_BY_INDEX_RANGE,
                &[int(RT_COUNT | INV), int(0), int(1)],
            ),
            Some(int(2)),
        );
        bin.holds(list(&[7]));
        same(
            bin.ok(REMOVE_BY_INDEX, &[int(RT_VALUE), int(0)]),
            Some(int(7)),
        );
        bin.holds(list(&[]));
    }

    #[test]
    fn value_intervals() {
        let interval = |rt: i64, args: &[Value]| {
            let mut all = vec![int(rt)];
            all.extend_from_slice(args);
            read(&l(), GET_BY_VALUE_INTERVAL, &all)
        };
        let (three, eight) = (int(3), int(8));
        same(
            interval(RT_VALUE, &[three.clone(), eight.clone()]),
            Some(list(&[7, 3, 3])),
        );
        same(
            interval(RT_INDEX, &[three.clone(), eight.clone()]),
            Some(list(&[0, 1, 3])),
        );
        same(
            interval(RT_REV_INDEX, &[three.clone(), eight.clone()]),
            Some(list(&[4, 3, 1])),
        );
        // Ranks ascending, as the reference.
        same(
            interval(RT_RANK, &[three.clone(), eight.clone()]),
            Some(list(&[1, 2, 3])),
        );
        same(
            interval(RT_REV_RANK, &[three.clone(), eight.clone()]),
            Some(list(&[1, 2, 3])),
        );
        same(
            interval(RT_COUNT, &[three.clone(), eight.clone()]),
            Some(int(3)),
        );
        same(
            interval(RT_VALUE | INV, &[three, eight]),
            Some(list(&[9, 1])),
        );
        // End excluded; nil begins below everything; no end is no bound.
        same(interval(RT_VALUE, &[int(1), int(3)]), Some(list(&[1])));
        same(interval(RT_VALUE, &[nil()]), Some(l()));
        same(
            interval(RT_VALUE, &[int(4), Value::Infinity]),
            Some(list(&[7, 9])),
        );
        same(interval(RT_VALUE, &[int(8), int(3)]), Some(list(&[])));
        same(interval(RT_VALUE, &[s("a")]), Some(list(&[])));

        // An ordered list answers as an index range.
        let mut bin = Bin::new(o());
        same(
            bin.ok(
                REMOVE_BY_VALUE_INTERVAL,
                &[int(RT_REV_INDEX), int(3), int(8)],
            ),
            Some(list(&[1, 2, 3])),
        );
        bin.holds(ordered(&[1, 9]));
    }

    #[test]
    fn rank_ranges() {
        let ranks = |rt: i64, args: &[i64]| {
            let mut all = vec![int(rt)];
            all.extend(args.iter().copied().map(int));
            read(&l(), GET_BY_RANK_RANGE, &all)
        };
        // Values in the reference's heap order (ranks 0..3 of 5 start
        // nearer the lowest rank: descending; ranks 3..5 nearer the
        // highest: ascending); indexes in index order; ranks ascending.
        same(ranks(RT_VALUE, &[0, 3]), Some(list(&[3, 3, 1])));
        same(ranks(RT_VALUE, &[1, 2]), Some(list(&[3, 3])));
        same(ranks(RT_VALUE, &[2, 2]), Some(list(&[3, 7])));
        same(ranks(RT_VALUE, &[3, 2]), Some(list(&[7, 9])));
        same(ranks(RT_INDEX, &[0, 3]), Some(list(&[1, 3, 4])));
        same(ranks(RT_RANK, &[0, 3]), Some(list(&[0, 1, 2])));
        same(ranks(RT_REV_RANK, &[0, 3]), Some(list(&[2, 3, 4])));
        same(ranks(RT_VALUE, &[-2]), Some(list(&[7, 9])));
        same(ranks(RT_VALUE | INV, &[-2]), Some(list(&[3, 3, 1])));
        same(ranks(RT_VALUE, &[-9, 5]), Some(list(&[1])));
        same(ranks(RT_VALUE, &[5, 5]), Some(list(&[])));
        same(ranks(RT_COUNT, &[1, 10]), Some(int(4)));
        same(
            read(&o(), GET_BY_RANK_RANGE, &[int(RT_VALUE), int(-2)]),
            Some(list(&[7, 9])),
        );

        let mut bin = Bin::new(l());
        same(
            bin.ok(REMOVE_BY_RANK_RANGE, &[int(RT_VALUE), int(-1), int(1)]),
            Some(list(&[9])),
        );
        bin.holds(list(&[7, 3, 3, 1]));
        same(
            bin.ok(REMOVE_BY_RANK_RANGE, &[int(RT_VALUE | INV), int(1), int(2)]),
            Some(list(&[7, 1])),
        );
        bin.holds(list(&[3, 3]));
    }

    #[test]
    fn relative_rank_ranges() {
        let relative = |rt: i64, args: &[i64]| {
            let mut all = vec![int(rt)];
            all.extend(args.iter().copied().map(int));
            read(&l(), GET_BY_VALUE_REL_RANK_RANGE, &all)
        };
        // Three elements sort below 5: rank 0 relative to 5 is rank 3.
        same(relative(RT_VALUE, &[5, 0]), Some(list(&[7, 9])));
        same(relative(RT_VALUE, &[5, -1, 2]), Some(list(&[3, 7])));
        same(relative(RT_INDEX, &[5, -1, 2]), Some(list(&[0, 3])));
        // Before rank 0: clamped, the count shrinking by as much.
        same(relative(RT_VALUE, &[5, -10, 8]), Some(list(&[1])));
        same(relative(RT_VALUE, &[5, -10, 7]), Some(list(&[])));
        // Ranks 0..2 of 5: the heap's descending order.
        same(relative(RT_VALUE, &[0, 0, 2]), Some(list(&[3, 1])));
        same(relative(RT_VALUE, &[3, 0, 1]), Some(list(&[3])));
        same(relative(RT_VALUE, &[100, 0]), Some(list(&[])));
        same(relative(RT_VALUE | INV, &[5, 0]), Some(list(&[3, 3, 1])));

        let mut bin = Bin::new(o());
        same(
            bin.ok(
                REMOVE_BY_VALUE_REL_RANK_RANGE,
                &[int(RT_COUNT), int(4), int(-1), int(2)],
            ),
            Some(int(2)),
        );
        bin.holds(ordered(&[1, 3, 9]));
        // A negative count is a huge unsigned one: to the end (the 9).
        same(
            bin.ok(
                REMOVE_BY_VALUE_REL_RANK_RANGE,
                &[int(RT_COUNT), int(4), int(0), int(-2)],
            ),
            Some(int(1)),
        );
        bin.holds(ordered(&[1, 3]));
    }

    #[test]
    fn removing_keeps_an_ordered_list_ordered() {
        let mut bin = Bin::new(ordered(&[1, 2, 3, 4, 5]));
        same(
            bin.ok(REMOVE_BY_INDEX_RANGE, &[int(RT_NONE), int(1), int(2)]),
            None,
        );
        bin.holds(ordered(&[1, 4, 5]));
        same(
            bin.ok(REMOVE_BY_VALUE, &[int(RT_EXISTS), int(4)]),
            Some(Value::Bool(true)),
        );
        bin.holds(ordered(&[1, 5]));
        same(bin.ok(TRIM, &[int(1), int(1)]), Some(int(1)));
        bin.holds(ordered(&[5]));
    }

    /// Every op code against garbage arguments: never a panic, a refusal
    /// never changes the list, an ordered list stays sorted (checked by
    /// `apply`'s debug assertion).
    #[test]
    fn garbage_never_panics_and_refusals_change_nothing() {
        // No NaN: `value::compare` is not a total order on NaN, and the
        // standard sorts may panic on such an order (reported upstream).
        let pool = vec![
            nil(),
            Value::Bool(true),
            int(0),
            int(-1),
            int(2),
            int(7),
            int(0x10007),
            int(i64::MIN),
            Value::UInt(u64::MAX),
            dbl(-0.5),
            s("x"),
            Value::Wildcard,
            Value::Infinity,
            list(&[3, 1]),
            list_of(vec![Value::Wildcard]),
            Value::Map(Map {
                flags: 0,
                entries: vec![(int(1), int(1))],
            }),
            Value::Ext(0xff, vec![9, 9]),
        ];
        let thirds = [
            int(0),
            int(-1),
            int(0x10007),
            Value::UInt(u64::MAX),
            s("x"),
            Value::Wildcard,
        ];
        let mut arg_lists: Vec<Vec<Value>> = vec![vec![]];
        for a in &pool {
            arg_lists.push(vec![a.clone()]);
            for b in &pool {
                arg_lists.push(vec![a.clone(), b.clone()]);
                for c in &thirds {
                    arg_lists.push(vec![a.clone(), b.clone(), c.clone()]);
                }
            }
        }
        arg_lists.push(vec![int(0); 5]);
        let starts = [
            None,
            Some(list(&[])),
            Some(list_of(vec![int(3), s("a"), nil(), int(3), dbl(1.5)])),
            Some(ordered(&[1, 2, 2, 8])),
            Some(int(4)),
        ];
        let mut successes = 0usize;
        for code in -1..=64 {
            for args in &arg_lists {
                for start in &starts {
                    let mut slot = start.clone();
                    match apply(code, args, &mut slot) {
                        Ok(_) => successes += 1,
                        Err(_) => {
                            assert_eq!(bytes(&slot), bytes(start), "code {code} args {args:?}")
                        }
                    }
                }
            }
        }
        assert!(successes > 0);
    }
}
