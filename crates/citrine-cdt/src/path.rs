//! Path expressions: the reference's CDT SELECT (op code 0xfe, servers
//! 8.1.1 and later), which walks a path of contexts through nested lists
//! and maps, where one level may pick every child or those a filter
//! expression holds for, and then returns what it reached (select) or
//! rewrites it (apply).
//!
//! Owns: the payload's parse ([`Path::parse`]: `[0xfe, [ctx...], flags]`
//! for a select, `[0xfe, [ctx...], flags | APPLY, modify expression]` for
//! an apply), the walk ([`Path::select`], [`Path::apply`]) and the result
//! shapes. It evaluates no expression itself: the caller (the expression
//! crate) parses the filter and modify expressions whose bytes
//! [`Path::filters`] and [`Path::modify_expression`] give, and answers
//! for them through [`PathEval`] with the loop variables bound
//! ([`LoopVars`]: a map level binds the entry's key and value, a list level
//! the element's index and value).
//!
//! Rules (the reference's): a level's context is a plain step (list
//! index, rank or value; map index, rank, key or value: every match of a
//! value step, one element for the others), the map entries whose keys a
//! list names (0x2a, missing keys ignored), or "all children" (id 4 with
//! `true`, or with a filter expression); an and-filter (0x204, with an
//! expression) after a step other than "all children" filters what that
//! step picked (never first, never twice on a level); a step made for one
//! collection kind meeting the other is a parameter error, even with
//! NO_FAIL; a missing element is no match, not an error; a rank step picks
//! among equal elements as the reference's quickselect does
//! (`result::quick_pick`); at a level before the last, a matched child
//! that is no collection is skipped (kept as it is in the matching tree);
//! a filter that is unknown is a parameter error unless NO_FAIL (then
//! false). Results: MATCHING_TREE (0) the root's kind
//! pruned to the matched paths (emptied containers kept); VALUE (1) a list
//! of the matched leaves; MAP_KEY (2) and MAP_KEY_VALUE (3) a list of the
//! matched map entries' keys (keys and values, flat), a matched list
//! element being incompatible (12) unless NO_FAIL (skipped). APPLY (4)
//! replaces each matched leaf with the modify expression's value, or
//! removes it when that is `result_remove`; an unknown value fails the op
//! (1) unless NO_FAIL (left as it is); ordered collections are sorted
//! again afterwards.
//!
//! Invariants: the walk never panics on any input; a select never changes
//! its input; an apply changes the value only when it succeeds as a whole
//! (the caller keeps the bin otherwise).

use crate::context::{LIST_INDEX, LIST_RANK, LIST_VALUE, MAP_INDEX, MAP_KEY, MAP_RANK, MAP_VALUE};
use crate::result::{index_of, order_by_value, quick_pick, resolve_index};
use crate::value::{self, List, Map, Value, MAX_DEPTH};
use crate::CdtError;
use std::cmp::Ordering;

/// The op code of a path payload.
pub const SELECT: i64 = 0xfe;

/// What the walk gives: the flags' low nibble.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The root pruned to the matched paths (0).
    Tree,
    /// The matched leaves (1).
    Values,
    /// The matched map entries' keys (2).
    MapKeys,
    /// The matched map entries' keys and values, flat (3).
    MapKeyValues,
    /// Each matched leaf rewritten by the modify expression (4).
    Apply,
}

/// The flag that turns unknown filters into "false", and unknown modify
/// results and matched list elements under MAP_KEY into "skip".
const NO_FAIL: i64 = 0x10;

/// "All children" (the plain step ids are [`crate::context`]'s).
const CHILDREN: i64 = 0x04;
/// The map entries whose keys a list names (8.1.2).
const MAP_KEYS_IN: i64 = 0x2a;
/// A filter on the level the step before picked (8.1.2).
const AND_FILTER: i64 = 0x204;

/// How one level of the path picks children.
#[derive(Debug)]
enum Pick {
    /// A plain step.
    Step { kind: i64, value: Value },
    /// The map entries whose keys are listed (missing ones ignored).
    KeysIn(Vec<Value>),
    /// Every child.
    Children,
}

/// One level of the path: what it picks, and the filter expression's
/// bytes the picked children must pass (an "all children" level's own
/// filter, or an and-filter after another step).
#[derive(Debug)]
struct Level {
    pick: Pick,
    filter: Option<Vec<u8>>,
}

/// A filter's answer for one child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Yes,
    No,
    Unknown,
}

/// The modify expression's answer for one leaf.
#[derive(Debug)]
pub enum Modified {
    /// The leaf's new value.
    Value(Value),
    /// `result_remove`: the leaf goes.
    Remove,
    /// Unknown (or no storable value).
    Unknown,
}

/// The loop variables bound while a filter or the modify expression runs.
pub struct LoopVars<'v> {
    /// The entry's key (map levels).
    pub key: Option<&'v Value>,
    /// The element's position (list levels).
    pub index: Option<i64>,
    /// The element or the entry's value.
    pub value: &'v Value,
}

/// Evaluates a path's expressions (the expression crate implements it).
pub trait PathEval {
    /// The filter of level `level` for one child.
    fn filter(&mut self, level: usize, vars: &LoopVars<'_>) -> Verdict;
    /// The modify expression for one matched leaf.
    fn modify(&mut self, vars: &LoopVars<'_>) -> Modified;
}

/// A parsed path payload.
#[derive(Debug)]
pub struct Path {
    levels: Vec<Level>,
    mode: Mode,
    no_fail: bool,
    modify: Option<Vec<u8>>,
}

/// Whether `payload` is a path payload (`[0xfe, ...]`).
pub fn is_path(payload: &[u8]) -> bool {
    let Some((count, header)) = array_header(payload) else {
        return false;
    };
    count >= 1
        && payload
            .get(header..)
            .and_then(|rest| first_value(rest).ok())
            .and_then(|(first, _)| value::decode(first).ok())
            .and_then(|first| first.as_int())
            == Some(SELECT)
}

impl Path {
    /// Parses `[0xfe, [ctx...], flags]` or `[0xfe, [ctx...], flags, exp]`.
    pub fn parse(payload: &[u8]) -> Result<Path, CdtError> {
        let (count, header) = array_header(payload).ok_or(CdtError::Parameter)?;
        let mut rest = payload.get(header..).ok_or(CdtError::Parameter)?;
        let mut items = Vec::with_capacity(count.min(4));
        for _ in 0..count {
            let (item, after) = first_value(rest)?;
            items.push(item);
            rest = after;
        }
        if !rest.is_empty() || !(3..=4).contains(&items.len()) {
            return Err(CdtError::Parameter);
        }
        let code = value::decode(items[0]).map_err(|_| CdtError::Parameter)?;
        if code.as_int() != Some(SELECT) {
            return Err(CdtError::Parameter);
        }
        let flags = value::decode(items[2])
            .ok()
            .and_then(|flags| flags.as_int())
            .ok_or(CdtError::Parameter)?;
        let mode = match flags & 0x0f {
            0 => Mode::Tree,
            1 => Mode::Values,
            2 => Mode::MapKeys,
            3 => Mode::MapKeyValues,
            4 => Mode::Apply,
            _ => return Err(CdtError::Parameter),
        };
        if (mode == Mode::Apply) != (items.len() == 4) {
            return Err(CdtError::Parameter);
        }
        let modify = match items.get(3) {
            Some(expression) if !expression.is_empty() => Some(expression.to_vec()),
            Some(_) => return Err(CdtError::Parameter),
            None => None,
        };
        Ok(Path {
            levels: parse_levels(items[1])?,
            mode,
            no_fail: flags & NO_FAIL != 0,
            modify,
        })
    }

    /// What the walk gives.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The filter expressions' bytes, by level.
    pub fn filters(&self) -> impl Iterator<Item = (usize, &[u8])> {
        self.levels
            .iter()
            .enumerate()
            .filter_map(|(level, step)| step.filter.as_deref().map(|filter| (level, filter)))
    }

    /// The modify expression's bytes (an apply only).
    pub fn modify_expression(&self) -> Option<&[u8]> {
        self.modify.as_deref()
    }

    /// What the path reaches in `root` (a list or map), in the shape its
    /// mode asks for.
    pub fn select(&self, root: &Value, eval: &mut dyn PathEval) -> Result<Value, CdtError> {
        if !is_collection(root) {
            return Err(CdtError::IncompatibleType);
        }
        match self.mode {
            Mode::Tree => self.tree(root, 0, eval),
            Mode::Apply => Err(CdtError::Parameter),
            _ => {
                let mut out = Vec::new();
                self.flat(root, 0, eval, &mut out)?;
                Ok(Value::List(List {
                    flags: 0,
                    items: out,
                }))
            }
        }
    }

    /// Rewrites what the path reaches in `root` (a list or map) with the
    /// modify expression. On an error `root` may be half-changed: the
    /// caller drops it.
    pub fn apply(&self, root: &mut Value, eval: &mut dyn PathEval) -> Result<(), CdtError> {
        if self.mode != Mode::Apply {
            return Err(CdtError::Parameter);
        }
        if !is_collection(root) {
            return Err(CdtError::IncompatibleType);
        }
        self.apply_at(root, 0, eval)?;
        value::canonicalize(root);
        Ok(())
    }

    fn last(&self, level: usize) -> bool {
        level + 1 == self.levels.len()
    }

    fn tree(&self, node: &Value, level: usize, eval: &mut dyn PathEval) -> Result<Value, CdtError> {
        let picked = self.picks(node, level, eval)?;
        let descend = |child: &Value, eval: &mut dyn PathEval| {
            if self.last(level) || !is_collection(child) {
                Ok(child.clone())
            } else {
                self.tree(child, level + 1, eval)
            }
        };
        Ok(match node {
            Value::List(list) => {
                let mut items = Vec::with_capacity(picked.len());
                for position in picked {
                    items.push(descend(&list.items[position], eval)?);
                }
                Value::List(List { flags: 0, items })
            }
            Value::Map(map) => {
                let mut entries = Vec::with_capacity(picked.len());
                for position in picked {
                    let (key, child) = &map.entries[position];
                    entries.push((key.clone(), descend(child, eval)?));
                }
                Value::Map(Map { flags: 0, entries })
            }
            _ => node.clone(),
        })
    }

    fn flat(
        &self,
        node: &Value,
        level: usize,
        eval: &mut dyn PathEval,
        out: &mut Vec<Value>,
    ) -> Result<(), CdtError> {
        let picked = self.picks(node, level, eval)?;
        for position in picked {
            let (key, child) = child_at(node, position);
            if !self.last(level) {
                if is_collection(child) {
                    self.flat(child, level + 1, eval, out)?;
                }
                continue;
            }
            match (self.mode, key) {
                (Mode::Values, _) => out.push(child.clone()),
                (Mode::MapKeys, Some(key)) => out.push(key.clone()),
                (Mode::MapKeyValues, Some(key)) => {
                    out.push(key.clone());
                    out.push(child.clone());
                }
                _ if self.no_fail => {}
                _ => return Err(CdtError::IncompatibleType),
            }
        }
        Ok(())
    }

    fn apply_at(
        &self,
        node: &mut Value,
        level: usize,
        eval: &mut dyn PathEval,
    ) -> Result<(), CdtError> {
        let picked = self.picks(node, level, eval)?;
        if !self.last(level) {
            for position in picked {
                let child = child_mut(node, position);
                if is_collection(child) {
                    self.apply_at(child, level + 1, eval)?;
                }
            }
            return Ok(());
        }
        let mut removed = Vec::new();
        for position in picked {
            let outcome = {
                let (key, child) = child_at(node, position);
                eval.modify(&LoopVars {
                    key,
                    index: key.is_none().then_some(position as i64),
                    value: child,
                })
            };
            match outcome {
                Modified::Value(new) => *child_mut(node, position) = new,
                Modified::Remove => removed.push(position),
                Modified::Unknown if self.no_fail => {}
                Modified::Unknown => return Err(CdtError::ExpressionFailed),
            }
        }
        // Positions are ascending: remove from the back.
        for position in removed.into_iter().rev() {
            match node {
                Value::List(list) => {
                    list.items.remove(position);
                }
                Value::Map(map) => {
                    map.entries.remove(position);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Positions (ascending) of the children of `node` that level `level`
    /// picks; none when `node` is no collection.
    fn picks(
        &self,
        node: &Value,
        level: usize,
        eval: &mut dyn PathEval,
    ) -> Result<Vec<usize>, CdtError> {
        let Some(step) = self.levels.get(level) else {
            return Ok(Vec::new());
        };
        let mut picked: Vec<usize> = match (&step.pick, node) {
            (Pick::Children, Value::List(_) | Value::Map(_)) => (0..collection_len(node)).collect(),
            (Pick::Step { kind, value }, Value::List(list)) => {
                if kind & 0x30 != 0x10 {
                    return Err(CdtError::Parameter);
                }
                let at = value.as_int().unwrap_or_default();
                match *kind {
                    LIST_INDEX => resolve_index(at, list.items.len()).into_iter().collect(),
                    LIST_RANK => resolve_index(at, list.items.len())
                        .map(|rank| {
                            if list.is_ordered() {
                                return rank;
                            }
                            let values: Vec<&Value> = list.items.iter().collect();
                            quick_pick(&values, rank)
                        })
                        .into_iter()
                        .collect(),
                    _ => equal_positions(list.items.iter(), value),
                }
            }
            (Pick::Step { kind, value }, Value::Map(map)) => {
                if kind & 0x30 != 0x20 {
                    return Err(CdtError::Parameter);
                }
                let at = value.as_int().unwrap_or_default();
                match *kind {
                    MAP_INDEX => {
                        let order = if map.is_key_ordered() {
                            (0..map.entries.len()).collect()
                        } else {
                            order_by_value(map.entries.iter().map(|(k, _)| k))
                        };
                        resolve_index(at, order.len())
                            .map(|i| order[i])
                            .into_iter()
                            .collect()
                    }
                    MAP_RANK => {
                        let values: Vec<&Value> = map.entries.iter().map(|(_, v)| v).collect();
                        resolve_index(at, values.len())
                            .map(|rank| quick_pick(&values, rank))
                            .into_iter()
                            .collect()
                    }
                    MAP_KEY => index_of(map, value).into_iter().collect(),
                    _ => equal_positions(map.entries.iter().map(|(_, v)| v), value),
                }
            }
            (Pick::KeysIn(keys), Value::Map(map)) => {
                keys.iter().filter_map(|key| index_of(map, key)).collect()
            }
            // A map step meeting a list.
            (Pick::KeysIn(_), Value::List(_)) => return Err(CdtError::Parameter),
            _ => Vec::new(),
        };
        picked.sort_unstable();
        picked.dedup();
        if step.filter.is_none() {
            return Ok(picked);
        }
        let mut passed = Vec::with_capacity(picked.len());
        for position in picked {
            let (key, child) = child_at(node, position);
            let vars = LoopVars {
                key,
                index: key.is_none().then_some(position as i64),
                value: child,
            };
            match eval.filter(level, &vars) {
                Verdict::Yes => passed.push(position),
                Verdict::No => {}
                Verdict::Unknown if self.no_fail => {}
                Verdict::Unknown => return Err(CdtError::Parameter),
            }
        }
        Ok(passed)
    }
}

/// The context list: `[id, value, ...]`, one pair a level.
fn parse_levels(bytes: &[u8]) -> Result<Vec<Level>, CdtError> {
    let (count, header) = array_header(bytes).ok_or(CdtError::Parameter)?;
    if count == 0 || count % 2 != 0 || count / 2 > MAX_DEPTH {
        return Err(CdtError::Parameter);
    }
    let mut rest = bytes.get(header..).ok_or(CdtError::Parameter)?;
    let mut levels = Vec::with_capacity(count / 2);
    for _ in 0..count / 2 {
        let (id, after) = first_value(rest)?;
        let (raw, after) = first_value(after)?;
        rest = after;
        let id = value::decode(id)
            .ok()
            .and_then(|id| id.as_int())
            .ok_or(CdtError::Parameter)?;
        let is_expression = matches!(raw.first(), Some(0x90..=0x9f | 0xdc | 0xdd));
        let pick = match id {
            CHILDREN => {
                let filter = match raw.first() {
                    Some(0xc3) if raw.len() == 1 => None,
                    _ if is_expression => Some(raw.to_vec()),
                    _ => return Err(CdtError::Parameter),
                };
                levels.push(Level {
                    pick: Pick::Children,
                    filter,
                });
                continue;
            }
            AND_FILTER => {
                // Filters the level before: not first, not after "all
                // children" (which has its own), not twice.
                match levels.last_mut() {
                    Some(level)
                        if is_expression
                            && level.filter.is_none()
                            && !matches!(level.pick, Pick::Children) =>
                    {
                        level.filter = Some(raw.to_vec());
                    }
                    _ => return Err(CdtError::Parameter),
                }
                continue;
            }
            MAP_KEYS_IN => match value::decode(raw) {
                Ok(Value::List(keys)) => Pick::KeysIn(keys.items),
                _ => return Err(CdtError::Parameter),
            },
            LIST_INDEX | LIST_RANK | LIST_VALUE | MAP_INDEX | MAP_RANK | MAP_KEY | MAP_VALUE => {
                let value = value::decode(raw).map_err(|_| CdtError::Parameter)?;
                if matches!(id, LIST_INDEX | LIST_RANK | MAP_INDEX | MAP_RANK)
                    && value.as_int().is_none()
                {
                    return Err(CdtError::Parameter);
                }
                Pick::Step { kind: id, value }
            }
            _ => return Err(CdtError::Parameter),
        };
        levels.push(Level { pick, filter: None });
    }
    if !rest.is_empty() {
        return Err(CdtError::Parameter);
    }
    Ok(levels)
}

/// A msgpack array's element count and header length.
fn array_header(bytes: &[u8]) -> Option<(usize, usize)> {
    let first = *bytes.first()?;
    match first {
        0x90..=0x9f => Some((usize::from(first & 0x0f), 1)),
        0xdc => Some((
            usize::from(u16::from_be_bytes([*bytes.get(1)?, *bytes.get(2)?])),
            3,
        )),
        0xdd => {
            let word = bytes.get(1..5)?;
            let count = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
            Some((usize::try_from(count).ok()?, 5))
        }
        _ => None,
    }
}

/// The first msgpack value of `bytes` and what follows it.
fn first_value(bytes: &[u8]) -> Result<(&[u8], &[u8]), CdtError> {
    let len = value::skip(bytes).map_err(|_| CdtError::Parameter)?;
    if len == 0 || len > bytes.len() {
        return Err(CdtError::Parameter);
    }
    Ok(bytes.split_at(len))
}

fn is_collection(value: &Value) -> bool {
    matches!(value, Value::List(_) | Value::Map(_))
}

fn collection_len(value: &Value) -> usize {
    match value {
        Value::List(list) => list.items.len(),
        Value::Map(map) => map.entries.len(),
        _ => 0,
    }
}

/// The key (map entries only) and value of the child at `position`.
fn child_at(node: &Value, position: usize) -> (Option<&Value>, &Value) {
    match node {
        Value::List(list) => (None, &list.items[position]),
        Value::Map(map) => {
            let (key, value) = &map.entries[position];
            (Some(key), value)
        }
        _ => (None, node),
    }
}

fn child_mut(node: &mut Value, position: usize) -> &mut Value {
    match node {
        Value::List(list) => &mut list.items[position],
        Value::Map(map) => &mut map.entries[position].1,
        other => other,
    }
}

fn equal_positions<'a>(values: impl Iterator<Item = &'a Value>, wanted: &Value) -> Vec<usize> {
    values
        .enumerate()
        .filter(|(_, v)| value::compare(v, wanted) == Ordering::Equal)
        .map(|(i, _)| i)
        .collect()
}

#[cfg(test)]
mod tests;
