//! An expression written out as the reference lists a secondary index's
//! expression (`sindex-list`: `add(bin_int("a"), 7)`,
//! `let(def(var_0, bin_int("a")), add(var("var_0"), 1))`).
//!
//! Owns the names of the ops and the way literals are shown: integers in
//! decimal, floats with six decimals, `true`/`false`/`nil`, strings, blobs
//! and GeoJSON by kind and size (`<string#3>`), list literals by length
//! (`<list#2>`), bin names quoted; a `let`'s variables renamed `var_0`,
//! `var_1`... in the order they are defined. Every form here was read off
//! the reference (CE 8.1.2) over the wire.
//!
//! Invariant: [`text`] answers `None` (the caller lists the bytes in
//! base64 instead) for anything it has no confirmed form for — module
//! calls (`[127, ...]`: list, map, bit and HLL ops), metadata, the key,
//! geo comparisons, loop variables, map literals — rather than a guess.
//! It never panics on any input.

use crate::reader::{Cursor, Kind};

/// Deepest nesting written out (deeper answers `None`).
const DEPTH_MAX: usize = 64;

/// `bytes` (one expression, msgpack) written out, or `None`.
pub fn text(bytes: &[u8]) -> Option<String> {
    let mut writer = Writer {
        cur: Cursor::new(bytes),
        scope: Vec::new(),
        defined: 0,
    };
    let out = writer.node(0)?;
    writer.cur.is_empty().then_some(out)
}

struct Writer<'a> {
    cur: Cursor<'a>,
    /// The `let` variables in scope: wire name and shown index.
    scope: Vec<(&'a [u8], usize)>,
    /// Variables defined so far (the next one's index).
    defined: usize,
}

impl<'a> Writer<'a> {
    fn node(&mut self, depth: usize) -> Option<String> {
        if depth > DEPTH_MAX {
            return None;
        }
        match self.cur.peek()? {
            Kind::Array => self.op(depth),
            Kind::Int => Some(self.cur.int()?.to_string()),
            Kind::Float => Some(format!("{:.6}", self.cur.float()?)),
            Kind::Bool => Some(self.cur.boolean()?.to_string()),
            Kind::Nil => {
                self.cur.value()?;
                Some("nil".to_owned())
            }
            Kind::Bytes => particle_text(self.cur.bytes()?),
            Kind::Map | Kind::Other => None,
        }
    }

    fn op(&mut self, depth: usize) -> Option<String> {
        let count = self.cur.array()?;
        let code = self.cur.uint()?;
        let n = count.checked_sub(1)?;
        match code {
            0 if n == 0 => Some("unknown()".to_owned()),
            7 if n == 3 => self.regex(depth),
            64 if n == 1 => Some(format!("digest_modulo({})", self.cur.int()?)),
            81 if n == 2 => self.bin(),
            82 | 83 if n == 1 => {
                let name = if code == 82 { "bin_type" } else { "bin_exists" };
                Some(format!("{name}({})", quoted(self.cur.bytes()?)?))
            }
            124 if n == 1 => self.var(),
            125 => self.let_(n, depth),
            126 if n == 1 => self.list_literal(),
            _ => {
                let name = op_name(code)?;
                self.call(name, n, depth)
            }
        }
    }

    /// `name(arg, ...)` with every argument written out.
    fn call(&mut self, name: &str, n: usize, depth: usize) -> Option<String> {
        let mut args = Vec::with_capacity(n.min(16));
        for _ in 0..n {
            args.push(self.node(depth + 1)?);
        }
        Some(format!("{name}({})", args.join(", ")))
    }

    /// `[7, flags, pattern, subject]` → `cmp_regex(<string#N>, flags, subject)`.
    fn regex(&mut self, depth: usize) -> Option<String> {
        let flags = self.cur.int()?;
        let pattern = self.cur.bytes()?;
        let subject = self.node(depth + 1)?;
        Some(format!(
            "cmp_regex(<string#{}>, {flags}, {subject})",
            pattern.len()
        ))
    }

    /// `[81, type, name]` → `bin_int("name")`.
    fn bin(&mut self) -> Option<String> {
        let kind = match self.cur.uint()? {
            0 => "nil",
            1 => "bool",
            2 => "int",
            3 => "str",
            4 => "list",
            5 => "map",
            6 => "blob",
            7 => "float",
            8 => "geojson",
            _ => return None,
        };
        Some(format!("bin_{kind}({})", quoted(self.cur.bytes()?)?))
    }

    /// `[124, name]` → `var("var_N")`, N the variable's definition order.
    fn var(&mut self) -> Option<String> {
        let name = self.cur.bytes()?;
        let (_, index) = self.scope.iter().rev().find(|(known, _)| *known == name)?;
        Some(format!("var(\"var_{index}\")"))
    }

    /// `[125, name, def, ..., body]` → `let(def(var_0, def), ..., body)`.
    fn let_(&mut self, n: usize, depth: usize) -> Option<String> {
        if n < 3 || n.is_multiple_of(2) {
            return None;
        }
        let scoped = self.scope.len();
        let mut parts = Vec::with_capacity((n / 2 + 1).min(16));
        for _ in 0..n / 2 {
            let name = self.cur.bytes()?;
            let value = self.node(depth + 1)?;
            let index = self.defined;
            self.defined += 1;
            self.scope.push((name, index));
            parts.push(format!("def(var_{index}, {value})"));
        }
        parts.push(self.node(depth + 1)?);
        self.scope.truncate(scoped);
        Some(format!("let({})", parts.join(", ")))
    }

    /// `[126, [items]]` → `<list#N>`.
    fn list_literal(&mut self) -> Option<String> {
        if self.cur.peek()? != Kind::Array {
            return None;
        }
        let len = self.cur.array()?;
        for _ in 0..len {
            self.cur.value()?;
        }
        Some(format!("<list#{len}>"))
    }
}

/// The name of an op written as `name(args)`.
fn op_name(code: u64) -> Option<&'static str> {
    Some(match code {
        1 => "eq",
        2 => "ne",
        3 => "gt",
        4 => "ge",
        5 => "lt",
        6 => "le",
        9 => "in_list",
        16 => "and",
        17 => "or",
        18 => "not",
        19 => "exclusive",
        20 => "add",
        21 => "sub",
        22 => "mul",
        23 => "div",
        24 => "pow",
        25 => "log",
        26 => "mod",
        27 => "abs",
        28 => "floor",
        29 => "ceil",
        30 => "to_int",
        31 => "to_float",
        32 => "int_and",
        33 => "int_or",
        34 => "int_xor",
        35 => "int_not",
        36 => "int_lshift",
        37 => "int_rshift",
        38 => "int_arshift",
        39 => "int_count",
        40 => "int_lscan",
        41 => "int_rscan",
        50 => "min",
        51 => "max",
        101 => "map_keys",
        123 => "cond",
        _ => return None,
    })
}

/// A particle-prefixed literal by kind and size.
fn particle_text(bytes: &[u8]) -> Option<String> {
    let (&particle, payload) = bytes.split_first()?;
    let kind = match particle {
        3 => "string",
        4 => "blob",
        23 => "geojson",
        _ => return None,
    };
    Some(format!("<{kind}#{}>", payload.len()))
}

/// A bin name in double quotes (names are printable, without quotes).
fn quoted(name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    if name.chars().any(|c| c == '"' || c.is_control()) {
        return None;
    }
    Some(format!("\"{name}\""))
}

#[cfg(test)]
mod tests {
    use super::text;

    /// Writes a msgpack value of the shapes the tests need.
    enum M {
        I(i64),
        F(f64),
        S(&'static str),
        P(u8, &'static [u8]),
        A(Vec<M>),
    }

    fn pack(value: &M, out: &mut Vec<u8>) {
        match value {
            M::I(i) if (0..128).contains(i) => out.push(*i as u8),
            M::I(i) if (-32..0).contains(i) => out.push(*i as i8 as u8),
            M::I(i) => {
                out.push(0xd3);
                out.extend_from_slice(&i.to_be_bytes());
            }
            M::F(f) => {
                out.push(0xcb);
                out.extend_from_slice(&f.to_be_bytes());
            }
            M::S(s) => {
                out.push(0xa0 | s.len() as u8);
                out.extend_from_slice(s.as_bytes());
            }
            M::P(particle, bytes) => {
                out.push(0xa0 | (bytes.len() + 1) as u8);
                out.push(*particle);
                out.extend_from_slice(bytes);
            }
            M::A(items) => {
                out.push(0x90 | items.len() as u8);
                items.iter().for_each(|item| pack(item, out));
            }
        }
    }

    fn written(value: M) -> Option<String> {
        let mut bytes = Vec::new();
        pack(&value, &mut bytes);
        text(&bytes)
    }

    fn bin(kind: i64, name: &'static str) -> M {
        M::A(vec![M::I(81), M::I(kind), M::S(name)])
    }

    #[test]
    fn expressions_are_written_as_the_reference_lists_them() {
        use M::*;
        // Each case: what the reference (CE 8.1.2) answered in
        // `sindex-list` for an index created with the expression.
        let cases: Vec<(M, &str)> = vec![
            (A(vec![I(20), bin(2, "a"), I(7)]), "add(bin_int(\"a\"), 7)"),
            (A(vec![I(20), bin(2, "a"), I(-5)]), "add(bin_int(\"a\"), -5)"),
            (
                A(vec![I(30), A(vec![I(20), bin(7, "f"), F(1.5)])]),
                "to_int(add(bin_float(\"f\"), 1.500000))",
            ),
            (A(vec![I(36), bin(2, "a"), I(1)]), "int_lshift(bin_int(\"a\"), 1)"),
            (A(vec![I(20), bin(2, "a"), A(vec![I(64), I(3)])]), "add(bin_int(\"a\"), digest_modulo(3))"),
            (
                A(vec![I(123), A(vec![I(1), bin(2, "a"), I(5)]), I(1), I(2)]),
                "cond(eq(bin_int(\"a\"), 5), 1, 2)",
            ),
            (
                A(vec![I(123), A(vec![I(1), bin(2, "a"), I(1)]), bin(2, "a"), A(vec![I(0)])]),
                "cond(eq(bin_int(\"a\"), 1), bin_int(\"a\"), unknown())",
            ),
            (
                A(vec![
                    I(125),
                    S("x"),
                    bin(2, "a"),
                    S("y"),
                    A(vec![I(20), A(vec![I(124), S("x")]), I(1)]),
                    A(vec![I(20), A(vec![I(124), S("y")]), A(vec![I(124), S("x")])]),
                ]),
                "let(def(var_0, bin_int(\"a\")), def(var_1, add(var(\"var_0\"), 1)), add(var(\"var_1\"), var(\"var_0\")))",
            ),
            (
                A(vec![I(123), A(vec![I(7), I(2), S("a.*"), bin(3, "s")]), bin(2, "a"), I(0)]),
                "cond(cmp_regex(<string#3>, 2, bin_str(\"s\")), bin_int(\"a\"), 0)",
            ),
            (
                A(vec![I(123), A(vec![I(1), bin(4, "l"), A(vec![I(126), A(vec![I(1), I(2)])])]), bin(2, "a"), I(0)]),
                "cond(eq(bin_list(\"l\"), <list#2>), bin_int(\"a\"), 0)",
            ),
            (
                A(vec![I(123), A(vec![I(1), bin(6, "b"), P(4, &[1, 2])]), bin(2, "a"), I(0)]),
                "cond(eq(bin_blob(\"b\"), <blob#2>), bin_int(\"a\"), 0)",
            ),
            (bin(8, "g"), "bin_geojson(\"g\")"),
        ];
        for (value, expected) in cases {
            assert_eq!(written(value).as_deref(), Some(expected));
        }
    }

    #[test]
    fn forms_without_a_confirmed_text_are_not_guessed() {
        use M::*;
        // A module call (list size), metadata (last update), a truncated
        // expression, and trailing bytes.
        let call = A(vec![I(127), I(2), I(0), A(vec![I(16)]), bin(4, "l")]);
        assert_eq!(written(call), None);
        assert_eq!(written(A(vec![I(20), bin(2, "a"), A(vec![I(66)])])), None);
        assert_eq!(text(&[0x93, 0x14, 0x93]), None);
        assert_eq!(text(&[0x07, 0x07]), None);
        for len in 0..64 {
            let junk: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let _ = text(&junk);
        }
    }
}
