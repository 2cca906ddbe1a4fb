//! Values between the record model and Lua.
//!
//! Owns: a bin's particle → [`Value`] ([`bin_value`]) and back
//! ([`particle_of`]); [`Value`] → Lua ([`to_lua`]) and Lua → [`Value`]
//! ([`from_lua`]), using the prelude's metatables to tell lists, maps,
//! blobs and GeoJSON apart.
//!
//! Rules:
//! - a list may hold nils: its length is kept beside it (the prelude's
//!   `List.__len`), as a Lua sequence cannot hold them;
//! - integers stay integers and floats floats (Lua 5.4 keeps the two
//!   apart); a uint64 above `i64::MAX` becomes the signed integer of the
//!   same 64 bits (as the reference server does: `u64::MAX` is -1);
//! - a Lua table without one of the prelude's metatables is a list when its
//!   keys are exactly 1..n, otherwise a map (an empty one is a list);
//! - a record returned by a UDF becomes the map of its bins;
//! - a map's entries come out sorted by key (Lua's own order depends on
//!   its hashing), so one map always gives the same bytes;
//! - a list or map read from a bin keeps its order flags (the prelude's
//!   `order_flags`, beside it as `lengths` is), so an ordered list or map
//!   a UDF writes back stays ordered; a list or map made in Lua has no
//!   flags (unordered);
//! - functions, coroutines and userdata are not values: returning one is an
//!   error, as is nesting deeper than [`crate::DEPTH_MAX`] (a table that
//!   holds itself).

use crate::DEPTH_MAX;
use citrine_cdt::value::{self, List, Map, Value};
use citrine_types::ParticleType;
use mlua::{Lua, Table, Value as LuaValue};

/// The prelude's metatables.
pub(crate) struct Metatables {
    pub list: Table,
    pub map: Table,
    pub bytes: Table,
    pub geojson: Table,
    pub record: Table,
    pub stream_record: Table,
    /// `internal.bins`: a record's bins.
    pub record_bins: mlua::Function,
    /// `internal.set_length`: the length of a list holding nils.
    pub set_length: mlua::Function,
    /// `internal.length`: a list's length, nils included.
    pub length: mlua::Function,
    /// `internal.order_flags`: the order flags a list or map came with.
    pub order_flags: mlua::Function,
    /// `internal.set_order_flags`: records them.
    pub set_order_flags: mlua::Function,
}

/// The most values (every element of every list and map counts) one
/// conversion out of Lua may produce.
pub const VALUES_MAX: usize = 1 << 21;

/// The most bytes of strings and blobs one conversion out of Lua may
/// produce.
pub const BYTES_MAX: usize = 128 << 20;

/// What is left of one conversion's allowance: Lua builds large values from
/// small ones cheaply (a table holding the same string a million times), so
/// their Rust copies are counted as they are made.
pub(crate) struct Budget {
    values: usize,
    bytes: usize,
}

impl Budget {
    pub(crate) fn new() -> Budget {
        Budget {
            values: VALUES_MAX,
            bytes: BYTES_MAX,
        }
    }

    fn spend(&mut self, bytes: usize) -> Result<(), String> {
        self.values = self
            .values
            .checked_sub(1)
            .ok_or_else(|| format!("a UDF value may hold at most {VALUES_MAX} elements"))?;
        self.bytes = self
            .bytes
            .checked_sub(bytes)
            .ok_or_else(|| format!("a UDF value may hold at most {BYTES_MAX} bytes"))?;
        Ok(())
    }
}

/// A stored bin's value (`particle_type`, wire bytes) as a [`Value`];
/// `None` for bytes that do not make a value of that type.
pub fn bin_value(particle_type: u8, bytes: &[u8]) -> Option<Value> {
    match ParticleType::from_u8(particle_type)? {
        ParticleType::Null => Some(Value::Nil),
        ParticleType::Integer => {
            let array: [u8; 8] = bytes.try_into().ok()?;
            Some(Value::Int(i64::from_be_bytes(array)))
        }
        ParticleType::Float => {
            let array: [u8; 8] = bytes.try_into().ok()?;
            Some(Value::Double(f64::from_be_bytes(array)))
        }
        ParticleType::String => Some(Value::Str(bytes.to_vec())),
        ParticleType::Bool => Some(Value::Bool(bytes.first().is_some_and(|b| *b != 0))),
        ParticleType::List | ParticleType::Map => value::decode_stored(bytes).ok(),
        ParticleType::GeoJson => {
            let cells = usize::from(u16::from_be_bytes([*bytes.get(1)?, *bytes.get(2)?]));
            Some(Value::Geo(bytes.get(3 + cells * 8..)?.to_vec()))
        }
        ParticleType::Blob
        | ParticleType::JavaBlob
        | ParticleType::CsharpBlob
        | ParticleType::PythonBlob
        | ParticleType::RubyBlob
        | ParticleType::PhpBlob
        | ParticleType::ErlangBlob
        | ParticleType::Hll => Some(Value::Blob(particle_type, bytes.to_vec())),
    }
}

/// The particle type and wire bytes that store `value` in a bin; `None`
/// for nil (no bin) and for the range helpers, which are not values.
pub fn particle_of(value: &Value) -> Option<(u8, Vec<u8>)> {
    Some(match value {
        Value::Nil | Value::Wildcard | Value::Infinity => return None,
        Value::Bool(b) => (ParticleType::Bool as u8, vec![u8::from(*b)]),
        Value::Int(i) => (ParticleType::Integer as u8, i.to_be_bytes().to_vec()),
        Value::UInt(u) => (ParticleType::Integer as u8, u.to_be_bytes().to_vec()),
        Value::Double(d) => (ParticleType::Float as u8, d.to_be_bytes().to_vec()),
        Value::Str(s) => (ParticleType::String as u8, s.clone()),
        Value::Blob(subtype, b) => {
            // A blob keeps its language subtype, or stays an HLL; any other
            // number (`bytes.set_type`, a client's prefix byte) is a plain
            // blob, never another particle type.
            let particle = match ParticleType::from_u8(*subtype) {
                Some(
                    ParticleType::JavaBlob
                    | ParticleType::CsharpBlob
                    | ParticleType::PythonBlob
                    | ParticleType::RubyBlob
                    | ParticleType::PhpBlob
                    | ParticleType::ErlangBlob
                    | ParticleType::Hll,
                ) => *subtype,
                _ => ParticleType::Blob as u8,
            };
            (particle, b.clone())
        }
        Value::Geo(text) => {
            // Flags, no cells, then the text (what clients send).
            let mut bytes = vec![0, 0, 0];
            bytes.extend_from_slice(text);
            (ParticleType::GeoJson as u8, bytes)
        }
        Value::List(_) => (ParticleType::List as u8, value::to_bytes(value)),
        Value::Map(_) => (ParticleType::Map as u8, value::to_bytes(value)),
        Value::Ext(_, b) => (ParticleType::Blob as u8, b.clone()),
    })
}

/// `value` as a Lua value.
pub(crate) fn to_lua(lua: &Lua, meta: &Metatables, value: &Value) -> mlua::Result<LuaValue> {
    Ok(match value {
        Value::Nil | Value::Wildcard | Value::Infinity => LuaValue::Nil,
        Value::Bool(b) => LuaValue::Boolean(*b),
        Value::Int(i) => LuaValue::Integer(*i),
        // As the reference: the 64 bits, read as a signed integer.
        // The same 64 bits, read as signed (see the module doc).
        Value::UInt(u) => LuaValue::Integer(*u as i64),
        Value::Double(d) => LuaValue::Number(*d),
        Value::Str(s) => LuaValue::String(lua.create_string(s)?),
        Value::Blob(subtype, b) | Value::Ext(subtype, b) => {
            let table = lua.create_table()?;
            table.raw_set("s", lua.create_string(b)?)?;
            table.raw_set("t", i64::from(*subtype))?;
            table.set_metatable(Some(meta.bytes.clone()))?;
            LuaValue::Table(table)
        }
        Value::Geo(text) => {
            let table = lua.create_table()?;
            table.raw_set("json", lua.create_string(text)?)?;
            table.set_metatable(Some(meta.geojson.clone()))?;
            LuaValue::Table(table)
        }
        Value::List(list) => {
            let table = lua.create_table_with_capacity(list.items.len(), 0)?;
            let mut holes = false;
            for (index, item) in list.items.iter().enumerate() {
                let item = to_lua(lua, meta, item)?;
                holes |= item.is_nil();
                table.raw_set(index + 1, item)?;
            }
            table.set_metatable(Some(meta.list.clone()))?;
            if list.flags != 0 {
                meta.set_order_flags
                    .call::<()>((table.clone(), i64::from(list.flags)))?;
            }
            if holes {
                // A Lua sequence cannot hold nil: the list keeps its length
                // apart.
                meta.set_length
                    .call::<()>((table.clone(), list.items.len()))?;
            }
            LuaValue::Table(table)
        }
        Value::Map(map) => {
            let table = lua.create_table_with_capacity(0, map.entries.len())?;
            for (key, item) in &map.entries {
                let key = to_lua(lua, meta, key)?;
                let item = to_lua(lua, meta, item)?;
                if key.is_nil() || item.is_nil() {
                    continue;
                }
                if let LuaValue::Number(n) = key {
                    if n.is_nan() {
                        continue;
                    }
                }
                table.raw_set(key, item)?;
            }
            table.set_metatable(Some(meta.map.clone()))?;
            if map.flags != 0 {
                meta.set_order_flags
                    .call::<()>((table.clone(), i64::from(map.flags)))?;
            }
            LuaValue::Table(table)
        }
    })
}

/// A Lua value as a [`Value`].
pub(crate) fn from_lua(
    meta: &Metatables,
    value: &LuaValue,
    depth: usize,
    budget: &mut Budget,
) -> Result<Value, String> {
    if depth > DEPTH_MAX {
        return Err(format!(
            "a value nests deeper than {DEPTH_MAX} levels (a table that holds itself?)"
        ));
    }
    let size = match value {
        LuaValue::String(s) => s.as_bytes().len(),
        _ => 0,
    };
    budget.spend(size)?;
    Ok(match value {
        LuaValue::Nil => Value::Nil,
        LuaValue::Boolean(b) => Value::Bool(*b),
        LuaValue::Integer(i) => Value::Int(*i),
        LuaValue::Number(n) => Value::Double(*n),
        LuaValue::String(s) => Value::Str(s.as_bytes().to_vec()),
        LuaValue::Table(table) => return table_value(meta, table, depth, budget),
        LuaValue::Error(error) => Value::Str(error.to_string().into_bytes()),
        other => return Err(format!("a UDF cannot return a {}", other.type_name())),
    })
}

fn table_value(
    meta: &Metatables,
    table: &Table,
    depth: usize,
    budget: &mut Budget,
) -> Result<Value, String> {
    let lua_error = |error: mlua::Error| error.to_string();
    let metatable = table.metatable();
    let is = |known: &Table| metatable.as_ref() == Some(known);
    if is(&meta.bytes) {
        let bytes: mlua::LuaString = table.raw_get("s").map_err(lua_error)?;
        budget.spend(bytes.as_bytes().len())?;
        let subtype: i64 = table.raw_get("t").unwrap_or(4);
        let subtype = u8::try_from(subtype).unwrap_or(4);
        return Ok(Value::Blob(subtype, bytes.as_bytes().to_vec()));
    }
    if is(&meta.geojson) {
        let text: mlua::LuaString = table.raw_get("json").map_err(lua_error)?;
        budget.spend(text.as_bytes().len())?;
        return Ok(Value::Geo(text.as_bytes().to_vec()));
    }
    if is(&meta.record) || is(&meta.stream_record) {
        let bins: Table = meta.record_bins.call(table).map_err(lua_error)?;
        return map_value(meta, &bins, 0, depth, budget);
    }
    if is(&meta.list) {
        let length: i64 = meta.length.call(table.clone()).map_err(lua_error)?;
        let flags = recorded_flags(meta, table)?.unwrap_or(0);
        return list_value(
            meta,
            table,
            usize::try_from(length).unwrap_or(0),
            flags,
            depth,
            budget,
        );
    }
    if is(&meta.map) {
        // One read from a bin keeps its own flags; a map made in Lua has
        // none (the official Go client's suite reads such a map, stored or
        // returned, as a plain map).
        let flags = recorded_flags(meta, table)?.unwrap_or(0);
        return map_value(meta, table, flags, depth, budget);
    }
    // A plain table: a list when its keys are exactly 1..n (its own
    // metatable, if any, is not consulted).
    let length = table.raw_len();
    let mut count = 0usize;
    for pair in table.pairs::<LuaValue, LuaValue>() {
        pair.map_err(lua_error)?;
        count += 1;
        if count > VALUES_MAX {
            return Err(format!(
                "a UDF value may hold at most {VALUES_MAX} elements"
            ));
        }
    }
    if count == length {
        list_value(meta, table, length, 0, depth, budget)
    } else {
        map_value(meta, table, 0, depth, budget)
    }
}

/// The order flags recorded for a list or map read from a bin.
fn recorded_flags(meta: &Metatables, table: &Table) -> Result<Option<u8>, String> {
    let flags: Option<i64> = meta
        .order_flags
        .call(table.clone())
        .map_err(|error| error.to_string())?;
    Ok(flags.and_then(|flags| u8::try_from(flags).ok()))
}

fn list_value(
    meta: &Metatables,
    table: &Table,
    length: usize,
    flags: u8,
    depth: usize,
    budget: &mut Budget,
) -> Result<Value, String> {
    let mut items = Vec::with_capacity(length.min(1024));
    for index in 1..=length {
        let item: LuaValue = table.raw_get(index).map_err(|error| error.to_string())?;
        items.push(from_lua(meta, &item, depth + 1, budget)?);
    }
    Ok(Value::List(List { flags, items }))
}

fn map_value(
    meta: &Metatables,
    table: &Table,
    flags: u8,
    depth: usize,
    budget: &mut Budget,
) -> Result<Value, String> {
    let mut entries = Vec::new();
    for pair in table.pairs::<LuaValue, LuaValue>() {
        let (key, item) = pair.map_err(|error| error.to_string())?;
        entries.push((
            from_lua(meta, &key, depth + 1, budget)?,
            from_lua(meta, &item, depth + 1, budget)?,
        ));
    }
    // Lua's table order depends on its hashing: keep the reply the same
    // for the same map.
    entries.sort_by(|a, b| value::compare_total(&a.0, &b.0));
    Ok(Value::Map(Map { flags, entries }))
}
