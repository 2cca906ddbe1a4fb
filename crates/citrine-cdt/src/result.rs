//! Return types (protocol 05 §2.2) and the helpers every selector shares:
//! the rank order of elements, key lookup, and shaping the selected
//! elements into the result a return type asks for.
//!
//! Terms: an element's *index* is its position in index order (a list's
//! order; a map's key order), its *rank* its position in value order (ties
//! by index). A selection is a set of indexes; [`Selection::result`] turns
//! it into the reply value.

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

/// The elements a selector chose, and how to describe them.
pub(crate) struct Selection<'a> {
    /// Keys in index order (maps), or `None` for lists.
    pub keys: Option<Vec<&'a Value>>,
    /// Values in index order.
    pub values: Vec<&'a Value>,
    /// Chosen indexes, in the order the result lists them.
    pub chosen: Vec<usize>,
    /// Whether the op names one element (scalar results) rather than a range.
    pub single: bool,
}

impl Selection<'_> {
    /// Applies the INVERTED flag: the complement, in index order.
    pub(crate) fn invert(&mut self) {
        let mut taken = vec![false; self.values.len()];
        for &i in &self.chosen {
            taken[i] = true;
        }
        self.chosen = (0..self.values.len()).filter(|&i| !taken[i]).collect();
        self.single = false;
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
        let ranks = || ranks_of(self.values.iter().copied());
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
