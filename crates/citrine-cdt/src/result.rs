//! Return types (protocol 05 §2.2) and the helpers every selector shares:
//! the rank order of elements, key lookup, and shaping the selected
//! elements into the result a return type asks for.
//!
//! Terms: an element's *index* is its position in index order (a list's
//! order; a map's key order), its *rank* its position in value order (ties
//! by index). A selection is a set of indexes; [`Selection::result`] turns
//! it into the reply value. Two exceptions follow the reference's ties in
//! unordered lists: a rank range picks among equal elements as a binary
//! heap does ([`heap_pick`]), and an element chosen by index is ranked
//! by the number of elements less than it ([`RankTies::Shared`]).
//!
//! A selector chooses in one order, its [`Space`]: index ranges, key
//! intervals and key lists by index; rank ranges, value intervals, values
//! and value lists by rank. When a result numbers the elements in that
//! same space (indexes of an index selection, ranks of a rank selection),
//! the reference answers with the numbers of the chosen stretch rather
//! than element by element: each maximal run `[a, b)` of chosen positions
//! in ascending order, a reverse numbering giving `n-b .. n-a` ascending
//! for it. An inverted range is the stretch before it and the one after
//! (an empty one is the whole collection, but for the selectors that keep
//! their split, [`Extent::Range`]); an inverted set is the runs of what it
//! left out. Some selectors list the whole collection, when it ends up
//! chosen, as `0..n` for every index and rank result ([`Whole`]). EXISTS
//! of an inverted selection follows the reference's code paths, which
//! differ by selector ([`InvertedExists`]). Each [`Shape`] rule was read
//! off the reference's answers (8.1.2).

use crate::value::{self, List, Map, Value, MAP_KEY_ORDERED, MAP_PRESERVE_ORDER};
use crate::CdtError;
use std::cmp::Ordering;

/// What a get/remove-by op answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReturnType {
    None,
    Index,
    ReverseIndex,
    Rank,
    ReverseRank,
    Count,
    Key,
    Value,
    KeyValue,
    Exists,
    UnorderedMap,
    OrderedMap,
}

/// The INVERTED flag OR-ed into a return type: select the complement.
pub(crate) const INVERTED: i64 = 0x10000;

/// The bits of a return-type argument that name the type; the reference
/// ignores those above the INVERTED flag.
const TYPE_MASK: i64 = 0xffff;

/// Parses a return-type argument; returns it and whether it is inverted.
/// A type this server does not know cannot apply to the op
/// (`OpNotApplicable`, as the reference answers); an argument that is no
/// integer is a `Parameter` error.
pub(crate) fn parse_return_type(arg: Option<&Value>) -> Result<(ReturnType, bool), CdtError> {
    let raw = arg.and_then(Value::as_int).ok_or(CdtError::Parameter)?;
    let inverted = raw & INVERTED != 0;
    let rt = match raw & TYPE_MASK {
        0 => ReturnType::None,
        1 => ReturnType::Index,
        2 => ReturnType::ReverseIndex,
        3 => ReturnType::Rank,
        4 => ReturnType::ReverseRank,
        5 => ReturnType::Count,
        6 => ReturnType::Key,
        7 => ReturnType::Value,
        8 => ReturnType::KeyValue,
        13 => ReturnType::Exists,
        16 => ReturnType::UnorderedMap,
        17 => ReturnType::OrderedMap,
        _ => return Err(CdtError::OpNotApplicable),
    };
    Ok((rt, inverted))
}

/// Positions of `values` sorted by value (stable: ties keep their order).
pub(crate) fn order_by_value<'a>(values: impl Iterator<Item = &'a Value>) -> Vec<usize> {
    let values: Vec<&Value> = values.collect();
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| value::compare_total(values[a], values[b]));
    order
}

/// Ranks of `values`: `ranks[i]` is element i's rank.
pub(crate) fn ranks_of<'a>(values: impl Iterator<Item = &'a Value>) -> Vec<usize> {
    let order = order_by_value(values);
    let mut ranks = vec![0; order.len()];
    for (rank, &i) in order.iter().enumerate() {
        ranks[i] = rank;
    }
    ranks
}

/// The positions of the last occurrence of each distinct value in `items`,
/// ascending: the order in which the reference answers a value or key
/// list holding a value more than once (an earlier occurrence counts as
/// a duplicate of the last).
pub(crate) fn last_occurrences(items: &[Value]) -> Vec<usize> {
    let order = order_by_value(items.iter());
    let mut kept: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|&(at, &i)| {
            order.get(at + 1).is_none_or(|&next| {
                value::compare_total(&items[i], &items[next]) != Ordering::Equal
            })
        })
        .map(|(_, &i)| i)
        .collect();
    kept.sort_unstable();
    kept
}

/// Shared ranks of `values`: `ranks[i]` is the number of elements less than
/// element i, so equal elements share the lowest rank among them (how the
/// reference numbers an unordered list's elements chosen by index).
pub(crate) fn shared_ranks_of<'a>(values: impl Iterator<Item = &'a Value>) -> Vec<usize> {
    let values: Vec<&Value> = values.collect();
    let order = order_by_value(values.iter().copied());
    let mut ranks = vec![0; order.len()];
    let mut run_start = 0;
    for (rank, &i) in order.iter().enumerate() {
        if rank > 0 && value::compare_total(values[order[rank - 1]], values[i]) != Ordering::Equal {
            run_start = rank;
        }
        ranks[i] = run_start;
    }
    ranks
}

/// The positions of ranks `start..start + count` of `values`, a collection
/// without an order of its own (an unordered list), as the reference picks
/// them, in the order it lists them.
///
/// The reference picks with a binary heap of positions rather than a sort,
/// so which of several equal elements a rank names follows the heap, not
/// the positions. The heap is a min-heap when the range starts no further
/// from the lowest rank than it ends from the highest (else a max-heap);
/// it is built bottom-up over all positions in index order, and its top
/// is taken `skip + count` times, where `skip` is the number of ranks
/// before the range on the heap's side; the last `count` tops taken are
/// the pick, listed last-taken first (so descending from a min-heap,
/// ascending from a max-heap). Sifting down follows the left child unless
/// the right one is strictly further to the heap's side, and moves only
/// when that child is strictly further than its parent. An out-of-range
/// `start` or `count` is clamped to the collection.
pub(crate) fn heap_pick(values: &[&Value], start: usize, count: usize) -> Vec<usize> {
    let n = values.len();
    let start = start.min(n);
    let count = count.min(n - start);
    let tail = n - start - count;
    let (side, skip) = if start <= tail {
        (Ordering::Less, start)
    } else {
        (Ordering::Greater, tail)
    };
    let mut heap = PickHeap {
        values,
        side,
        slots: (0..n).collect(),
        filled: n,
    };
    heap.build();
    heap.take_tops(skip + count);
    let filled = heap.filled;
    heap.slots.truncate(filled + count);
    heap.slots.split_off(filled)
}

/// The position of the element of `rank` among `values` (in storage
/// order) as the reference's path select (CDT SELECT) finds it in an
/// unordered list, or by value in a map: with a quickselect, so which of
/// equal elements a rank names follows its partitions.
///
/// Each round takes the middle slot of the window `lo..=hi` as pivot and
/// moves it to `lo`; a left cursor from `lo + 1` passes elements strictly
/// less than the pivot (never reaching the right cursor), a right cursor
/// from `hi` passes elements strictly greater (never passing the left one),
/// and the two elements they stop at are swapped and both cursors step on,
/// until they meet or cross; the pivot is then swapped to where the right
/// cursor stopped. That slot holds rank `right`: the answer when it is
/// `rank`, else the window narrows to the side holding `rank`, and a
/// window of one slot (or none) answers the element at its start.
/// `rank` must be below `values.len()`.
pub(crate) fn quick_pick(values: &[&Value], rank: usize) -> usize {
    let n = values.len();
    if n < 2 {
        return 0;
    }
    let mut slots: Vec<usize> = (0..n).collect();
    let cmp = |a: usize, b: usize| value::compare_total(values[a], values[b]);
    let (mut lo, mut hi) = (0, n - 1);
    loop {
        let pivot = slots[lo + (hi - lo) / 2];
        slots.swap(lo, lo + (hi - lo) / 2);
        let (mut left, mut right) = (lo + 1, hi);
        loop {
            while left < right && cmp(slots[left], pivot) == Ordering::Less {
                left += 1;
            }
            while left <= right && right != lo && cmp(pivot, slots[right]) == Ordering::Less {
                right -= 1;
            }
            if left >= right {
                break;
            }
            slots.swap(left, right);
            left += 1;
            right -= 1;
        }
        slots.swap(lo, right);
        match right.cmp(&rank) {
            Ordering::Equal => return pivot,
            Ordering::Less => lo = right + 1,
            Ordering::Greater => hi = right.saturating_sub(1),
        }
        if lo >= hi {
            return slots[lo.min(n - 1)];
        }
    }
}

/// The binary heap [`heap_pick`] describes: `slots[..filled]` is the heap
/// (a parent at `i`, its children at `2i + 1` and `2i + 2`), the tops taken
/// fill `slots[filled..]` from the end backwards.
struct PickHeap<'v, 'a> {
    values: &'v [&'a Value],
    /// `Less`: the smallest value on top; `Greater`: the largest.
    side: Ordering,
    slots: Vec<usize>,
    filled: usize,
}

impl PickHeap<'_, '_> {
    /// Whether the element in slot `a` is strictly further to the heap's
    /// side than the one in slot `b`.
    fn beyond(&self, a: usize, b: usize) -> bool {
        value::compare_total(self.values[self.slots[a]], self.values[self.slots[b]]) == self.side
    }

    /// Moves the element in slot `at` down until its children are not
    /// strictly further to the heap's side.
    fn sift_down(&mut self, mut at: usize) {
        loop {
            let left = 2 * at + 1;
            if left >= self.filled {
                return;
            }
            let right = left + 1;
            let child = if right < self.filled && self.beyond(right, left) {
                right
            } else {
                left
            };
            if !self.beyond(child, at) {
                return;
            }
            self.slots.swap(at, child);
            at = child;
        }
    }

    fn build(&mut self) {
        for at in (0..self.filled / 2).rev() {
            self.sift_down(at);
        }
    }

    /// Takes the top `times` times: the last leaf replaces it and sinks,
    /// and the taken top goes to the slot just past the shrunk heap.
    fn take_tops(&mut self, times: usize) {
        for _ in 0..times.min(self.filled) {
            let last = self.filled - 1;
            self.slots.swap(0, last);
            self.filled = last;
            self.sift_down(0);
        }
    }
}

/// The entry position of `key` in `map` (exact key match, no wildcards).
pub(crate) fn index_of(map: &Map, key: &Value) -> Option<usize> {
    if map.is_key_ordered() {
        map.entries
            .binary_search_by(|(k, _)| value::compare(k, key))
            .ok()
    } else {
        map.entries
            .iter()
            .position(|(k, _)| value::compare(k, key) == Ordering::Equal)
    }
}

/// Resolves a signed index or rank against `len`: `Some(i)` when in range.
pub(crate) fn resolve_index(index: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let i = if index < 0 {
        index.checked_add(len)?
    } else {
        index
    };
    (0..len).contains(&i).then_some(i as usize)
}

/// The half-open range `[start, end)` an (index, optional count) selects
/// in a collection of `len` elements, as the reference clamps it: a
/// negative index counts from the end, an index before the start is
/// clamped to 0 (the count shrinking by as much), a missing or negative
/// count means "to the end". May be empty.
pub(crate) fn range_of(
    index: i64,
    count: Option<i64>,
    len: usize,
) -> Result<(usize, usize), CdtError> {
    let len_i = i64::try_from(len).map_err(|_| CdtError::Parameter)?;
    let mut start = if index < 0 {
        index.saturating_add(len_i)
    } else {
        index
    };
    let mut count = match count {
        // The reference's "to the end" is the largest u32 count.
        None => i64::from(u32::MAX),
        // The wire count is unsigned: a negative one is huge, "to the end".
        Some(c) if c < 0 => i64::MAX,
        Some(c) => c,
    };
    if start < 0 {
        count = count.saturating_add(start);
        start = 0;
    }
    let start = start.min(len_i);
    let end = start.saturating_add(count.max(0)).min(len_i);
    Ok((start as usize, end as usize))
}

/// The order a selector chooses in (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Space {
    Index,
    Rank,
    /// An ordered list's, where index and rank are one.
    Both,
}

/// What a selector chose, in its [`Space`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Extent {
    /// The positions `[start, end)`. `split`: inverted and empty, it is
    /// still the stretch before `start` and the one after (the reference's
    /// list rank ranges and unordered maps' key intervals), not the whole
    /// collection.
    Range {
        start: usize,
        end: usize,
        split: bool,
    },
    /// Positions that need not be contiguous (value and key lists).
    Set,
}

impl Extent {
    /// A range that is the whole collection when inverted and empty.
    pub(crate) fn range(start: usize, end: usize) -> Extent {
        Extent::Range {
            start,
            end: end.max(start),
            split: false,
        }
    }
}

/// When the whole collection ends up chosen, whether the reference lists
/// it as `0..n` whatever the index or rank result asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Whole {
    Never,
    /// Index ranges (lists and maps).
    Always,
    /// Map value matches and intervals, inverted: index results only.
    IndexResultsWhenInverted,
}

/// What EXISTS answers for an inverted selection (the reference's code
/// paths differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InvertedExists {
    /// Whether anything is left.
    Complement,
    /// Whether the selector chose nothing in a non-empty collection
    /// (rank ranges of unordered lists; value matches and intervals of
    /// maps).
    NothingChosen,
    /// Whether the selector chose nothing, an empty collection included
    /// (value matches and intervals of unordered lists; key intervals of
    /// unordered maps).
    NoMatch,
    /// Whether what is left is one run of positions in the selector's
    /// space: a range that touched an end of the collection or was empty
    /// (rank ranges of maps; index ranges of unordered maps).
    OneStretch,
}

/// How an element chosen by index is ranked when equal elements tie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RankTies {
    /// Ties in index order: every element its own rank (maps, whose ties
    /// are in key order, and everything not chosen by index).
    ByIndex,
    /// Equal elements share the lowest rank among them (unordered lists'
    /// elements chosen by index, as the reference ranks them).
    Shared,
}

/// How a multi-element selector's choice is described beyond its
/// elements (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub space: Space,
    pub extent: Extent,
    pub whole: Whole,
    pub exists: InvertedExists,
}

impl Shape {
    pub(crate) fn new(space: Space, extent: Extent) -> Shape {
        Shape {
            space,
            extent,
            whole: Whole::Never,
            exists: InvertedExists::Complement,
        }
    }

    pub(crate) fn whole(self, whole: Whole) -> Shape {
        Shape { whole, ..self }
    }

    pub(crate) fn exists(self, exists: InvertedExists) -> Shape {
        Shape { exists, ..self }
    }
}

/// The elements a selector chose, and how to describe them.
pub(crate) struct Selection<'a> {
    /// Keys in index order (maps), or `None` for lists.
    pub keys: Option<Vec<&'a Value>>,
    /// Values in index order.
    pub values: Vec<&'a Value>,
    /// Chosen indexes, in the order the result lists them (the complement
    /// of the selector's choice when `inverted`).
    pub chosen: Vec<usize>,
    /// Whether the op names one element (scalar results) rather than a range.
    pub single: bool,
    /// The selector's shape (`None` for single-element ops).
    pub shape: Option<Shape>,
    /// Whether the op asked for the complement.
    pub inverted: bool,
    /// How RANK and REVERSE_RANK number elements listed one by one.
    pub rank_ties: RankTies,
}

impl Selection<'_> {
    /// Takes the complement of `chosen`, in index order.
    pub(crate) fn invert(&mut self) {
        let mut taken = vec![false; self.values.len()];
        for &i in &self.chosen {
            taken[i] = true;
        }
        self.chosen = (0..self.values.len()).filter(|&i| !taken[i]).collect();
        self.single = false;
    }

    /// The numbers an index or rank result lists when it numbers the
    /// selector's own space, or the whole collection (module doc); `None`
    /// when the result is described element by element.
    fn stretch_numbers(&self, rt: ReturnType) -> Option<Vec<usize>> {
        let shape = self.shape?;
        let (wanted, reverse) = match rt {
            ReturnType::Index => (Space::Index, false),
            ReturnType::ReverseIndex => (Space::Index, true),
            ReturnType::Rank => (Space::Rank, false),
            ReturnType::ReverseRank => (Space::Rank, true),
            _ => return None,
        };
        let n = self.values.len();
        let whole = n > 0 && self.chosen.len() == n;
        let ascending = match shape.whole {
            Whole::Always => whole,
            Whole::IndexResultsWhenInverted => whole && self.inverted && wanted == Space::Index,
            Whole::Never => false,
        };
        if ascending {
            return Some((0..n).collect());
        }
        if shape.space != wanted && shape.space != Space::Both {
            return None;
        }
        let stretches = match (shape.extent, self.inverted) {
            (Extent::Range { start, end, .. }, false) => vec![(start, end)],
            (Extent::Range { start, end, split }, true) if start < end || split => {
                vec![(0, start), (end, n)]
            }
            (Extent::Range { .. }, true) => vec![(0, n)],
            (Extent::Set, false) => return None,
            (Extent::Set, true) => {
                let mut positions: Vec<usize> = match shape.space {
                    Space::Index | Space::Both => self.chosen.clone(),
                    Space::Rank => {
                        let ranks = ranks_of(self.values.iter().copied());
                        self.chosen.iter().map(|&i| ranks[i]).collect()
                    }
                };
                positions.sort_unstable();
                runs(&positions)
            }
        };
        Some(
            stretches
                .into_iter()
                .filter(|(a, b)| a < b && *b <= n)
                .flat_map(|(a, b)| if reverse { (n - b)..(n - a) } else { a..b })
                .collect(),
        )
    }

    /// EXISTS of an inverted selection (see [`InvertedExists`]).
    fn inverted_exists(&self) -> bool {
        let n = self.values.len();
        let Some(shape) = self.shape else {
            return !self.chosen.is_empty();
        };
        match shape.exists {
            InvertedExists::Complement => return !self.chosen.is_empty(),
            InvertedExists::NothingChosen => return n > 0 && self.chosen.len() == n,
            InvertedExists::NoMatch => return self.chosen.len() == n,
            InvertedExists::OneStretch => {}
        }
        let mut positions: Vec<usize> = match shape.space {
            Space::Index | Space::Both => self.chosen.clone(),
            Space::Rank => {
                let ranks = ranks_of(self.values.iter().copied());
                self.chosen.iter().map(|&i| ranks[i]).collect()
            }
        };
        positions.sort_unstable();
        runs(&positions).len() == 1
    }

    /// The result value for `rt`; `None` for [`ReturnType::None`].
    pub(crate) fn result(&self, rt: ReturnType) -> Result<Option<Value>, CdtError> {
        let len = self.values.len();
        let ints = |f: &dyn Fn(usize) -> usize| -> Value {
            if self.single && self.chosen.is_empty() {
                // A single element not found: -1, as the reference.
                return Value::Int(-1);
            }
            let items: Vec<Value> = self
                .chosen
                .iter()
                .map(|&i| Value::Int(f(i) as i64))
                .collect();
            self.scalar_or_list(items)
        };
        let ranks = || match self.rank_ties {
            RankTies::ByIndex => ranks_of(self.values.iter().copied()),
            RankTies::Shared => shared_ranks_of(self.values.iter().copied()),
        };
        if let Some(numbers) = self.stretch_numbers(rt) {
            let items = numbers.into_iter().map(|i| Value::Int(i as i64)).collect();
            return Ok(Some(Value::List(List { flags: 0, items })));
        }
        Ok(Some(match rt {
            ReturnType::None => return Ok(None),
            ReturnType::Index => ints(&|i| i),
            ReturnType::ReverseIndex => ints(&|i| len - 1 - i),
            ReturnType::Rank => {
                let ranks = ranks();
                ints(&|i| ranks[i])
            }
            ReturnType::ReverseRank => {
                let ranks = ranks();
                ints(&|i| len - 1 - ranks[i])
            }
            ReturnType::Count => Value::Int(self.chosen.len() as i64),
            ReturnType::Exists if self.inverted => Value::Bool(self.inverted_exists()),
            ReturnType::Exists => Value::Bool(!self.chosen.is_empty()),
            ReturnType::Value | ReturnType::Key if self.single && self.chosen.is_empty() => {
                // A single element not found: no result, as the reference.
                return Ok(None);
            }
            ReturnType::Value => {
                let items: Vec<Value> = self
                    .chosen
                    .iter()
                    .map(|&i| self.values[i].clone())
                    .collect();
                self.scalar_or_list(items)
            }
            ReturnType::Key => {
                let keys = self.keys.as_ref().ok_or(CdtError::Parameter)?;
                let items: Vec<Value> = self.chosen.iter().map(|&i| keys[i].clone()).collect();
                self.scalar_or_list(items)
            }
            ReturnType::KeyValue | ReturnType::UnorderedMap | ReturnType::OrderedMap => {
                let keys = self.keys.as_ref().ok_or(CdtError::Parameter)?;
                let entries: Vec<(Value, Value)> = self
                    .chosen
                    .iter()
                    .map(|&i| (keys[i].clone(), self.values[i].clone()))
                    .collect();
                let flags = match rt {
                    ReturnType::OrderedMap => MAP_KEY_ORDERED,
                    ReturnType::UnorderedMap => 0,
                    _ => MAP_PRESERVE_ORDER,
                };
                let mut map = Map { flags, entries };
                if rt == ReturnType::OrderedMap {
                    map.entries
                        .sort_by(|(a, _), (b, _)| value::compare_total(a, b));
                }
                Value::Map(map)
            }
        }))
    }

    fn scalar_or_list(&self, mut items: Vec<Value>) -> Value {
        if self.single {
            return items.pop().unwrap_or(Value::Nil);
        }
        Value::List(List { flags: 0, items })
    }
}

/// The maximal runs `[a, b)` of consecutive numbers in sorted `positions`.
fn runs(positions: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &p in positions {
        match out.last_mut() {
            Some((_, end)) if *end == p => *end = p + 1,
            _ => out.push((p, p + 1)),
        }
    }
    out
}
