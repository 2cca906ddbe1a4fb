//! List and map operations for [`Client::operate`](crate::Client::operate)
//! (protocol 05 §2): each builds an [`Operation::Cdt`] whose payload is the
//! msgpack `[op_code, args...]` the server runs on one bin.
//!
//! Owns the op codes and argument orders of the operations offered here
//! (the common ones); anything else can be sent as [`Operation::Raw`].
//! Results come back in the op's bin: a list or map as a `Value::List` /
//! `Value::Map` (read it with [`Value::elements`]), a count or size as an
//! integer.

use crate::command::Operation;
use crate::msgpack::{pack, pack_array_header, pack_int};
use crate::value::Value;

/// Map result type VALUE (05 §2.2).
const RETURN_VALUE: i64 = 7;
/// Map order UNORDERED (a new map's attribute).
const UNORDERED: i64 = 0;

/// Where the argument list of an op is built.
struct Payload(Vec<u8>);

impl Payload {
    fn new(code: i64, arguments: usize) -> Payload {
        let mut out = Vec::with_capacity(16);
        pack_array_header(&mut out, 1 + arguments);
        pack_int(&mut out, code);
        Payload(out)
    }

    fn int(mut self, value: i64) -> Payload {
        pack_int(&mut self.0, value);
        self
    }

    fn value(mut self, value: &Value) -> Payload {
        pack(&mut self.0, value);
        self
    }

    fn op(self, bin: impl Into<String>, modify: bool) -> Operation {
        Operation::Cdt {
            bin: bin.into(),
            modify,
            payload: self.0,
        }
    }
}

/// List operations (an absent bin is created as an empty list by writes).
pub mod list {
    use super::*;

    /// Appends a value; returns the new size.
    pub fn append(bin: impl Into<String>, value: &Value) -> Operation {
        Payload::new(1, 1).value(value).op(bin, true)
    }

    /// Appends every value (a list value, `msgpack::list`); returns the new size.
    pub fn append_items(bin: impl Into<String>, items: &Value) -> Operation {
        Payload::new(2, 1).value(items).op(bin, true)
    }

    /// Inserts a value at `index` (negative: from the end); returns the new size.
    pub fn insert(bin: impl Into<String>, index: i64, value: &Value) -> Operation {
        Payload::new(3, 2).int(index).value(value).op(bin, true)
    }

    /// Removes and returns the element at `index`.
    pub fn pop(bin: impl Into<String>, index: i64) -> Operation {
        Payload::new(5, 1).int(index).op(bin, true)
    }

    /// Removes `count` elements from `index`; returns how many went.
    pub fn remove_range(bin: impl Into<String>, index: i64, count: i64) -> Operation {
        Payload::new(8, 2).int(index).int(count).op(bin, true)
    }

    /// Sets the element at `index`.
    pub fn set(bin: impl Into<String>, index: i64, value: &Value) -> Operation {
        Payload::new(9, 2).int(index).value(value).op(bin, true)
    }

    /// Empties the list.
    pub fn clear(bin: impl Into<String>) -> Operation {
        Payload::new(11, 0).op(bin, true)
    }

    /// Adds `delta` to the number at `index`; returns the result.
    pub fn increment(bin: impl Into<String>, index: i64, delta: i64) -> Operation {
        Payload::new(12, 2).int(index).int(delta).op(bin, true)
    }

    /// The number of elements.
    pub fn size(bin: impl Into<String>) -> Operation {
        Payload::new(16, 0).op(bin, false)
    }

    /// The element at `index`.
    pub fn get(bin: impl Into<String>, index: i64) -> Operation {
        Payload::new(17, 1).int(index).op(bin, false)
    }

    /// `count` elements from `index`, as a list.
    pub fn get_range(bin: impl Into<String>, index: i64, count: i64) -> Operation {
        Payload::new(18, 2).int(index).int(count).op(bin, false)
    }
}

/// Map operations (an absent bin is created as an unordered map by writes).
pub mod map {
    use super::*;

    /// Puts `key` → `value`; returns the new size.
    pub fn put(bin: impl Into<String>, key: &Value, value: &Value) -> Operation {
        Payload::new(67, 3)
            .value(key)
            .value(value)
            .int(UNORDERED)
            .op(bin, true)
    }

    /// Puts every entry of a map value (`msgpack::map`); returns the new size.
    pub fn put_items(bin: impl Into<String>, entries: &Value) -> Operation {
        Payload::new(68, 2)
            .value(entries)
            .int(UNORDERED)
            .op(bin, true)
    }

    /// Adds `delta` to the number under `key` (0 when absent); returns the result.
    pub fn increment(bin: impl Into<String>, key: &Value, delta: i64) -> Operation {
        Payload::new(73, 3)
            .value(key)
            .int(delta)
            .int(UNORDERED)
            .op(bin, true)
    }

    /// Removes `key`; returns the value it had (nil when absent).
    pub fn remove_by_key(bin: impl Into<String>, key: &Value) -> Operation {
        Payload::new(76, 2)
            .int(RETURN_VALUE)
            .value(key)
            .op(bin, true)
    }

    /// Empties the map.
    pub fn clear(bin: impl Into<String>) -> Operation {
        Payload::new(75, 0).op(bin, true)
    }

    /// The number of entries.
    pub fn size(bin: impl Into<String>) -> Operation {
        Payload::new(96, 0).op(bin, false)
    }

    /// The value under `key` (nil when absent).
    pub fn get_by_key(bin: impl Into<String>, key: &Value) -> Operation {
        Payload::new(97, 2)
            .int(RETURN_VALUE)
            .value(key)
            .op(bin, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(op: &Operation) -> (&str, bool, &[u8]) {
        match op {
            Operation::Cdt {
                bin,
                modify,
                payload,
            } => (bin, *modify, payload),
            other => panic!("not a CDT op: {other:?}"),
        }
    }

    #[test]
    fn map_ops_ask_for_an_answer_per_op() {
        use crate::command::respond_all_ops;
        assert!(respond_all_ops(&[map::size("m"), list::size("l")]));
        assert!(!respond_all_ops(&[list::size("l")]));
        assert!(!respond_all_ops(&[map::size("m"), Operation::ReadAll]));
        let bits = Operation::Raw {
            op_type: citrine_wire::msg::op_type::BITS_READ,
            particle_type: 4,
            bin: "b".into(),
            value: vec![0x91, 50],
            write: false,
        };
        assert!(respond_all_ops(&[bits]));
    }

    #[test]
    fn payloads_follow_the_protocol() {
        assert_eq!(
            payload(&list::append("l", &Value::Int(5))),
            ("l", true, &[0x92, 1, 5][..])
        );
        assert_eq!(payload(&list::size("l")), ("l", false, &[0x91, 16][..]));
        assert_eq!(
            payload(&list::get_range("l", -2, 2)),
            ("l", false, &[0x93, 18, 0xfe, 2][..])
        );
        assert_eq!(
            payload(&map::put("m", &Value::String("k".into()), &Value::Int(1))),
            ("m", true, &[0x94, 67, 0xa2, 3, b'k', 1, 0][..])
        );
        assert_eq!(
            payload(&map::get_by_key("m", &Value::Int(9))),
            ("m", false, &[0x93, 97, 7, 9][..])
        );
    }
}
