//! Unit tests: every op family with real values, the three-valued logic,
//! parse-time refusals, the `EXP_READ`/`EXP_MODIFY` flags, and malformed
//! input (truncations and mutations of valid expressions) never panicking.

use super::*;
use citrine_cdt::value::{self, Value};

// ---------------------------------------------------------------------
// A record for tests.

struct Rec {
    bins: Vec<(Vec<u8>, u8, Vec<u8>)>,
    key: Option<(u8, Vec<u8>)>,
    digest: [u8; 20],
    set: Vec<u8>,
    lut_ms: u64,
    void_s: Option<u64>,
    size: u64,
    tombstone: bool,
    memory: bool,
}

impl Rec {
    fn new() -> Rec {
        Rec {
            bins: Vec::new(),
            key: None,
            digest: [0; 20],
            set: b"demo".to_vec(),
            lut_ms: 1_700_000_000_000,
            void_s: None,
            size: 321,
            tombstone: false,
            memory: false,
        }
    }

    fn with(mut self, name: &str, particle: u8, bytes: Vec<u8>) -> Rec {
        self.bins.push((name.as_bytes().to_vec(), particle, bytes));
        self
    }

    fn int(self, name: &str, i: i64) -> Rec {
        self.with(name, 1, i.to_be_bytes().to_vec())
    }

    fn float(self, name: &str, f: f64) -> Rec {
        self.with(name, 2, f.to_bits().to_be_bytes().to_vec())
    }

    fn str(self, name: &str, s: &str) -> Rec {
        self.with(name, 3, s.as_bytes().to_vec())
    }

    fn cdt(self, name: &str, v: &Value) -> Rec {
        let particle = if matches!(v, Value::Map(_)) { 19 } else { 20 };
        self.with(name, particle, value::to_bytes(v))
    }
}

impl Record for Rec {
    fn bin(&self, name: &[u8]) -> Option<(u8, &[u8])> {
        self.bins
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, p, b)| (*p, b.as_slice()))
    }
    fn key(&self) -> Option<(u8, &[u8])> {
        self.key.as_ref().map(|(p, b)| (*p, b.as_slice()))
    }
    fn digest(&self) -> &[u8; 20] {
        &self.digest
    }
    fn set_name(&self) -> &[u8] {
        &self.set
    }
    fn last_update_ms(&self) -> u64 {
        self.lut_ms
    }
    fn void_time_s(&self) -> Option<u64> {
        self.void_s
    }
    fn record_size(&self) -> u64 {
        self.size
    }
    fn is_tombstone(&self) -> bool {
        self.tombstone
    }
    fn exists(&self) -> bool {
        true
    }
    fn in_memory(&self) -> bool {
        self.memory
    }
}

const NOW_MS: u64 = 1_700_000_100_000;

// ---------------------------------------------------------------------
// Building expressions.

fn enc(v: &Value) -> Vec<u8> {
    value::to_bytes(v)
}

fn int(i: i64) -> Vec<u8> {
    enc(&Value::Int(i))
}

fn float(f: f64) -> Vec<u8> {
    enc(&Value::Double(f))
}

fn boolean(b: bool) -> Vec<u8> {
    enc(&Value::Bool(b))
}

fn nil() -> Vec<u8> {
    vec![0xc0]
}

/// A particle string literal.
fn s(text: &str) -> Vec<u8> {
    enc(&Value::str(text))
}

fn blob(bytes: &[u8]) -> Vec<u8> {
    enc(&Value::Blob(4, bytes.to_vec()))
}

/// A plain msgpack string (bin and variable names, regex patterns).
fn raw(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let n = text.len();
    assert!(n < 32);
    out.push(0xa0 | n as u8);
    out.extend_from_slice(text.as_bytes());
    out
}

fn header(n: usize) -> Vec<u8> {
    assert!(n < 16);
    vec![0x90 | n as u8]
}

fn op(code: u64, args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = header(args.len() + 1);
    out.extend(enc(&Value::Int(code as i64)));
    for arg in args {
        out.extend_from_slice(arg);
    }
    out
}

fn list_lit(items: Vec<Value>) -> Value {
    Value::List(value::List { flags: 0, items })
}

fn map_lit(flags: u8, entries: Vec<(Value, Value)>) -> Value {
    Value::Map(value::Map { flags, entries })
}

/// A quoted list literal.
fn quote(items: Vec<Value>) -> Vec<u8> {
    op(126, &[enc(&list_lit(items))])
}

/// A GeoJSON literal.
fn geo(text: &str) -> Vec<u8> {
    enc(&Value::Geo(text.as_bytes().to_vec()))
}

fn bin(ty: u64, name: &str) -> Vec<u8> {
    op(81, &[int(ty as i64), raw(name)])
}

fn ibin(name: &str) -> Vec<u8> {
    bin(2, name)
}

const T_BOOL: u64 = 1;
const T_INT: u64 = 2;
const T_STR: u64 = 3;
const T_LIST: u64 = 4;
const T_MAP: u64 = 5;
const T_BLOB: u64 = 6;
const T_FLOAT: u64 = 7;

fn eq(a: Vec<u8>, b: Vec<u8>) -> Vec<u8> {
    op(1, &[a, b])
}

fn unknown() -> Vec<u8> {
    op(0, &[])
}

/// Evaluates a filter.
fn truth(exp: &[u8], rec: &Rec) -> Truth {
    Expression::parse(exp).expect("parses").filter(rec, NOW_MS)
}

/// Evaluates any expression through EXP_READ.
fn read(exp: &[u8], rec: &Rec) -> Result<Option<(u8, Vec<u8>)>, ExpError> {
    let mut payload = header(2);
    payload.extend_from_slice(exp);
    payload.push(0);
    read_op(&payload, rec, NOW_MS)
}

fn read_int(exp: &[u8], rec: &Rec) -> Option<i64> {
    match read(exp, rec) {
        Ok(Some((1, bytes))) => Some(i64::from_be_bytes(bytes.try_into().ok()?)),
        _ => None,
    }
}

fn read_float(exp: &[u8], rec: &Rec) -> Option<f64> {
    match read(exp, rec) {
        Ok(Some((2, bytes))) => Some(f64::from_bits(u64::from_be_bytes(bytes.try_into().ok()?))),
        _ => None,
    }
}

fn empty() -> Rec {
    Rec::new()
}

fn refused(exp: &[u8]) -> ExpError {
    Expression::parse(exp).expect_err("refused")
}

// ---------------------------------------------------------------------
// Comparisons and bins.

#[test]
fn integer_comparisons() {
    let rec = Rec::new().int("a", 5);
    let table = [
        (1, 5, Truth::True),
        (1, 6, Truth::False),
        (2, 6, Truth::True),
        (3, 4, Truth::True),
        (3, 5, Truth::False),
        (4, 5, Truth::True),
        (5, 6, Truth::True),
        (5, 5, Truth::False),
        (6, 5, Truth::True),
        (6, 4, Truth::False),
    ];
    for (code, rhs, expected) in table {
        assert_eq!(
            truth(&op(code, &[ibin("a"), int(rhs)]), &rec),
            expected,
            "{code} {rhs}"
        );
    }
}

#[test]
fn missing_bins_and_other_types_are_unknown() {
    let rec = Rec::new().str("s", "x").int("i", 1);
    assert_eq!(truth(&eq(ibin("nope"), int(1)), &rec), Truth::Unknown);
    assert_eq!(truth(&eq(ibin("s"), int(1)), &rec), Truth::Unknown);
    // NOT of unknown stays unknown.
    assert_eq!(
        truth(&op(18, &[eq(ibin("s"), int(1))]), &rec),
        Truth::Unknown
    );
    // In an EXP_READ: OP_NOT_APPLICABLE, or nil with EVAL_NO_FAIL.
    assert_eq!(read(&ibin("s"), &rec), Err(ExpError::OpNotApplicable));
    let mut payload = header(2);
    payload.extend(ibin("s"));
    payload.push(0x10);
    assert_eq!(read_op(&payload, &rec, NOW_MS), Ok(None));
}

#[test]
fn floats_strings_blobs_bools_nil() {
    let rec = Rec::new()
        .float("f", 2.5)
        .float("nan", f64::NAN)
        .str("s", "abc")
        .with("b", 4, vec![1, 2])
        .with("t", 17, vec![1]);
    assert_eq!(
        truth(&op(3, &[bin(T_FLOAT, "f"), float(2.0)]), &rec),
        Truth::True
    );
    assert_eq!(
        truth(&eq(bin(T_FLOAT, "nan"), bin(T_FLOAT, "nan")), &rec),
        Truth::False
    );
    assert_eq!(
        truth(&op(2, &[bin(T_FLOAT, "nan"), float(1.0)]), &rec),
        Truth::True
    );
    // Bytewise, then shorter first.
    assert_eq!(
        truth(&op(5, &[bin(T_STR, "s"), s("abd")]), &rec),
        Truth::True
    );
    assert_eq!(
        truth(&op(3, &[bin(T_STR, "s"), s("ab")]), &rec),
        Truth::True
    );
    assert_eq!(
        truth(&eq(bin(T_BLOB, "b"), blob(&[1, 2])), &rec),
        Truth::True
    );
    assert_eq!(
        truth(&eq(bin(T_BOOL, "t"), boolean(true)), &rec),
        Truth::True
    );
    assert_eq!(
        truth(&op(3, &[boolean(true), boolean(false)]), &rec),
        Truth::True
    );
    assert_eq!(truth(&eq(nil(), nil()), &rec), Truth::True);
    assert_eq!(truth(&op(4, &[nil(), nil()]), &rec), Truth::True);
    assert_eq!(truth(&op(3, &[nil(), nil()]), &rec), Truth::False);
}

#[test]
fn comparisons_need_one_static_type() {
    // Integer against float, string against blob: refused at parse.
    assert_eq!(refused(&eq(int(1), float(1.0))), ExpError::Parameter);
    assert_eq!(refused(&eq(s("a"), blob(b"a"))), ExpError::Parameter);
    assert_eq!(
        refused(&eq(bin(T_INT, "a"), bin(T_FLOAT, "a"))),
        ExpError::Parameter
    );
    // HLL values do not compare; GeoJSON compares only with op 8, on
    // GeoJSON, and a literal must be a shape.
    let hll = enc(&Value::Blob(18, vec![1]));
    assert_eq!(refused(&eq(hll.clone(), hll)), ExpError::Parameter);
    assert_eq!(refused(&eq(bin(8, "g"), bin(8, "g"))), ExpError::Parameter);
    assert_eq!(
        refused(&op(8, &[bin(8, "g"), ibin("a")])),
        ExpError::Parameter
    );
    assert_eq!(
        refused(&op(8, &[bin(8, "g"), geo(r#"{"type":"Line"}"#)])),
        ExpError::Parameter
    );
    // A filter must be boolean.
    assert_eq!(refused(&int(1)), ExpError::Parameter);
    assert_eq!(refused(&ibin("a")), ExpError::Parameter);
}

/// `geo_compare`: a point bin inside a region literal, a region bin
/// holding a point literal (as the reference's `as_geojson_match`); two
/// points or two regions never match; a stored value that is no shape
/// matches nothing; a missing bin is unknown.
#[test]
fn geo_compare_matches_points_and_regions() {
    const BAY: &str = r#"{"type":"Polygon","coordinates":[[[-122.5,37.0],[-121.0,37.0],[-121.0,38.08],[-122.5,38.08],[-122.5,37.0]]]}"#;
    let particle = |text: &str| {
        let mut bytes = vec![0, 0, 0];
        bytes.extend_from_slice(text.as_bytes());
        bytes
    };
    let point = |lng: f64, lat: f64| format!(r#"{{"type":"Point","coordinates":[{lng},{lat}]}}"#);
    let within = |stored: &str, query: &str| {
        let rec = Rec::new().with("g", 23, particle(stored));
        truth(&op(8, &[bin(8, "g"), geo(query)]), &rec)
    };
    assert_eq!(within(&point(-122.0, 37.5), BAY), Truth::True);
    assert_eq!(within(&point(-120.0, 37.5), BAY), Truth::False);
    assert_eq!(within(BAY, &point(-121.7, 37.8)), Truth::True);
    assert_eq!(within(BAY, &point(0.0, 0.0)), Truth::False);
    let circle = r#"{"type":"AeroCircle","coordinates":[[-122.0,37.5],50000]}"#;
    assert_eq!(within(&point(-122.1, 37.6), circle), Truth::True);
    assert_eq!(
        within(&point(-122.0, 37.5), &point(-122.0, 37.5)),
        Truth::False
    );
    assert_eq!(within(BAY, BAY), Truth::False);
    assert_eq!(within("not json", BAY), Truth::False);
    assert_eq!(
        truth(&op(8, &[bin(8, "none"), geo(BAY)]), &Rec::new()),
        Truth::Unknown
    );
    // An empty region literal is evaluated, as the reference does: it
    // contains nothing (and a missing bin is still unknown).
    let empty = r#"{"type":"Polygon","coordinates":[]}"#;
    assert_eq!(within(&point(-122.0, 37.5), empty), Truth::False);
    assert_eq!(
        truth(&op(8, &[bin(8, "none"), geo(empty)]), &Rec::new()),
        Truth::Unknown
    );
    let nothing = r#"{"type":"AeroCircle","coordinates":[[-122.0,37.5],-1]}"#;
    assert_eq!(within(&point(-122.0, 37.5), nothing), Truth::False);
}

#[test]
fn bin_type_and_exists() {
    let rec = Rec::new().str("s", "x").with("j", 7, vec![1]);
    assert_eq!(read_int(&op(82, &[raw("s")]), &rec), Some(3));
    assert_eq!(read_int(&op(82, &[raw("j")]), &rec), Some(7));
    assert_eq!(read_int(&op(82, &[raw("zz")]), &rec), Some(0));
    assert_eq!(truth(&op(83, &[raw("s")]), &rec), Truth::True);
    assert_eq!(truth(&op(83, &[raw("zz")]), &rec), Truth::False);
    // A Java blob is no expression blob.
    assert_eq!(
        truth(&eq(bin(T_BLOB, "j"), blob(&[1])), &rec),
        Truth::Unknown
    );
    // Bin names longer than 15 bytes are refused.
    assert_eq!(
        refused(&op(83, &[raw("abcdefghijklmnop")])),
        ExpError::Parameter
    );
}

// ---------------------------------------------------------------------
// Three-valued logic.

fn tv(t: Truth) -> Vec<u8> {
    match t {
        Truth::True => boolean(true),
        Truth::False => boolean(false),
        Truth::Unknown => unknown(),
    }
}

#[test]
fn trilean_tables() {
    use Truth::{False as F, True as T, Unknown as U};
    let rec = empty();
    let and = [
        (T, T, T),
        (T, F, F),
        (T, U, U),
        (F, T, F),
        (F, F, F),
        (F, U, F),
        (U, T, U),
        (U, F, F),
        (U, U, U),
    ];
    for (a, b, expected) in and {
        assert_eq!(
            truth(&op(16, &[tv(a), tv(b)]), &rec),
            expected,
            "and {a:?} {b:?}"
        );
    }
    let or = [
        (T, T, T),
        (T, F, T),
        (T, U, T),
        (F, T, T),
        (F, F, F),
        (F, U, U),
        (U, T, T),
        (U, F, U),
        (U, U, U),
    ];
    for (a, b, expected) in or {
        assert_eq!(
            truth(&op(17, &[tv(a), tv(b)]), &rec),
            expected,
            "or {a:?} {b:?}"
        );
    }
    for (a, expected) in [(T, F), (F, T), (U, U)] {
        assert_eq!(truth(&op(18, &[tv(a)]), &rec), expected, "not {a:?}");
    }
    // Exclusive: exactly one true; an unknown before a decision is unknown,
    // a second true decides false at once.
    let xor = [
        (vec![T, F], T),
        (vec![F, F], F),
        (vec![T, T], F),
        (vec![T, F, F], T),
        (vec![F, U], U),
        (vec![U, T], U),
        (vec![T, T, U], F),
    ];
    for (args, expected) in xor {
        let args: Vec<Vec<u8>> = args.into_iter().map(tv).collect();
        assert_eq!(truth(&op(19, &args), &rec), expected);
    }
    // Logic ops need two or more boolean operands.
    assert_eq!(refused(&op(16, &[boolean(true)])), ExpError::Parameter);
    assert_eq!(
        refused(&op(16, &[boolean(true), int(1)])),
        ExpError::Parameter
    );
}

// ---------------------------------------------------------------------
// Arithmetic.

#[test]
fn integer_arithmetic() {
    let rec = Rec::new().int("a", 7).int("min", i64::MIN);
    let cases: Vec<(Vec<u8>, Option<i64>)> = vec![
        (op(20, &[ibin("a"), int(3), int(-1)]), Some(9)),
        (op(21, &[ibin("a"), int(10)]), Some(-3)),
        (op(21, &[ibin("a")]), Some(-7)),
        (op(22, &[ibin("a"), int(6)]), Some(42)),
        (op(23, &[ibin("a"), int(2)]), Some(3)),
        (op(23, &[int(-7), int(2)]), Some(-3)),
        (op(23, &[int(100), int(5), int(2)]), Some(10)),
        (op(23, &[int(1)]), Some(1)),
        (op(23, &[int(2)]), Some(0)),
        (op(23, &[ibin("a"), int(0)]), None),
        (op(23, &[int(0)]), None),
        (op(23, &[ibin("min"), int(-1)]), None),
        (op(26, &[int(-7), int(3)]), Some(-1)),
        (op(26, &[int(7), int(0)]), None),
        (op(26, &[ibin("min"), int(-1)]), None),
        (op(27, &[int(-4)]), Some(4)),
        (op(27, &[ibin("min")]), Some(i64::MIN)),
        (op(50, &[int(3), int(-2), int(9)]), Some(-2)),
        (op(51, &[int(3), int(-2), int(9)]), Some(9)),
        // Overflow wraps.
        (op(20, &[int(i64::MAX), int(1)]), Some(i64::MIN)),
        (op(22, &[int(i64::MAX), int(2)]), Some(-2)),
        (op(21, &[ibin("min")]), Some(i64::MIN)),
    ];
    for (exp, expected) in cases {
        assert_eq!(read_int(&exp, &rec), expected, "{exp:x?}");
    }
    // No mixing, and at least one operand.
    assert_eq!(
        read(&op(20, &[int(1), float(1.0)]), &rec),
        Err(ExpError::Parameter)
    );
    assert_eq!(read(&op(20, &[]), &rec), Err(ExpError::Parameter));
    assert_eq!(
        read(&op(26, &[float(1.0), float(1.0)]), &rec),
        Err(ExpError::Parameter)
    );
}

#[test]
fn float_arithmetic() {
    let rec = Rec::new().float("f", 2.5);
    let cases: Vec<(Vec<u8>, f64)> = vec![
        (op(20, &[bin(T_FLOAT, "f"), float(0.25)]), 2.75),
        (op(21, &[bin(T_FLOAT, "f")]), -2.5),
        (op(22, &[bin(T_FLOAT, "f"), float(4.0)]), 10.0),
        (op(23, &[float(10.0), float(2.0), float(2.0)]), 2.5),
        (op(23, &[float(4.0)]), 0.25),
        (op(24, &[float(2.0), float(10.0)]), 1024.0),
        (op(25, &[float(8.0), float(2.0)]), 3.0),
        (op(27, &[float(-1.5)]), 1.5),
        (op(28, &[float(-1.5)]), -2.0),
        (op(29, &[float(1.2)]), 2.0),
        (op(31, &[int(-3)]), -3.0),
        (op(50, &[float(1.0), float(-1.0)]), -1.0),
    ];
    for (exp, expected) in cases {
        assert_eq!(read_float(&exp, &rec), Some(expected), "{exp:x?}");
    }
    assert_eq!(
        read_float(&op(23, &[float(1.0), float(0.0)]), &rec),
        Some(f64::INFINITY)
    );
    assert_eq!(read_int(&op(30, &[float(-2.9)]), &rec), Some(-2));
    assert_eq!(read_int(&op(30, &[float(f64::NAN)]), &rec), Some(i64::MIN));
    assert_eq!(read_int(&op(30, &[float(1e30)]), &rec), Some(i64::MIN));
    // pow and log take floats only; floor takes a float.
    assert_eq!(
        read(&op(24, &[int(2), int(3)]), &rec),
        Err(ExpError::Parameter)
    );
    assert_eq!(read(&op(28, &[int(2)]), &rec), Err(ExpError::Parameter));
    assert_eq!(read(&op(30, &[int(2)]), &rec), Err(ExpError::Parameter));
}

#[test]
fn integer_bit_ops() {
    let rec = empty();
    let cases: Vec<(Vec<u8>, i64)> = vec![
        (op(32, &[int(0b1100), int(0b1010)]), 0b1000),
        (op(33, &[int(0b1100), int(0b1010)]), 0b1110),
        (op(34, &[int(0b1100), int(0b1010), int(1)]), 0b0111),
        (op(35, &[int(0)]), -1),
        (op(36, &[int(1), int(4)]), 16),
        (op(36, &[int(1), int(64)]), 1),
        (op(37, &[int(-1), int(60)]), 15),
        (op(38, &[int(-16), int(2)]), -4),
        (op(39, &[int(-1)]), 64),
        (op(39, &[int(0b1011)]), 3),
        (op(40, &[int(1), boolean(true)]), 63),
        (op(40, &[int(i64::MIN), boolean(true)]), 0),
        (op(40, &[int(0), boolean(true)]), -1),
        (op(40, &[int(-1), boolean(false)]), -1),
        (op(40, &[int(-2), boolean(false)]), 63),
        (op(41, &[int(1), boolean(true)]), 63),
        (op(41, &[int(0b110), boolean(true)]), 62),
        (op(41, &[int(0), boolean(true)]), -1),
        (op(41, &[int(-1), boolean(false)]), -1),
    ];
    for (exp, expected) in cases {
        assert_eq!(read_int(&exp, &rec), Some(expected), "{exp:x?}");
    }
    assert_eq!(
        read(&op(40, &[int(1), int(1)]), &rec),
        Err(ExpError::Parameter)
    );
}

// ---------------------------------------------------------------------
// Metadata and keys.

#[test]
fn metadata() {
    let mut rec = Rec::new();
    rec.digest[16..20].copy_from_slice(&[0x0a, 0, 0, 0]);
    assert_eq!(read_int(&op(64, &[int(3)]), &rec), Some(1));
    assert_eq!(read_int(&op(64, &[int(-3)]), &rec), Some(1));
    rec.digest[16..20].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]);
    assert_eq!(
        read_int(&op(64, &[int(1000)]), &rec),
        Some(4_294_967_295 % 1000)
    );
    assert_eq!(read(&op(64, &[int(0)]), &rec), Err(ExpError::Parameter));
    assert_eq!(
        read_int(&op(66, &[]), &rec),
        Some(1_700_000_000_000 * 1_000_000)
    );
    assert_eq!(read_int(&op(67, &[]), &rec), Some(100_000));
    assert_eq!(read_int(&op(68, &[]), &rec), Some(-1));
    assert_eq!(read_int(&op(69, &[]), &rec), Some(-1));
    rec.void_s = Some(NOW_MS / 1000 + 500);
    assert_eq!(
        read_int(&op(68, &[]), &rec),
        Some((NOW_MS / 1000 + 500) as i64 * 1_000_000_000)
    );
    assert_eq!(read_int(&op(69, &[]), &rec), Some(500));
    rec.void_s = Some(NOW_MS / 1000 - 5);
    assert_eq!(read_int(&op(69, &[]), &rec), Some(1));
    assert_eq!(read(&op(70, &[]), &rec), Ok(Some((3, b"demo".to_vec()))));
    assert_eq!(truth(&op(71, &[]), &rec), Truth::False);
    assert_eq!(truth(&op(72, &[]), &rec), Truth::False);
    assert_eq!(read_int(&op(74, &[]), &rec), Some(321));
    assert_eq!(read_int(&op(65, &[]), &rec), Some(321));
    assert_eq!(read_int(&op(73, &[]), &rec), Some(0));
    rec.memory = true;
    rec.tombstone = true;
    assert_eq!(read_int(&op(65, &[]), &rec), Some(0));
    assert_eq!(read_int(&op(73, &[]), &rec), Some(321));
    assert_eq!(truth(&op(72, &[]), &rec), Truth::True);
    // Metadata ops take no arguments.
    assert_eq!(read(&op(74, &[int(1)]), &rec), Err(ExpError::Parameter));
}

#[test]
fn record_keys() {
    let mut rec = Rec::new();
    assert_eq!(truth(&eq(op(80, &[int(2)]), int(9)), &rec), Truth::Unknown);
    rec.key = Some((1, 9i64.to_be_bytes().to_vec()));
    assert_eq!(truth(&op(71, &[]), &rec), Truth::True);
    assert_eq!(truth(&eq(op(80, &[int(2)]), int(9)), &rec), Truth::True);
    assert_eq!(truth(&eq(op(80, &[int(3)]), s("9")), &rec), Truth::Unknown);
    rec.key = Some((3, b"k1".to_vec()));
    assert_eq!(truth(&eq(op(80, &[int(3)]), s("k1")), &rec), Truth::True);
    rec.key = Some((4, vec![7]));
    assert_eq!(truth(&eq(op(80, &[int(6)]), blob(&[7])), &rec), Truth::True);
    // Only integer, string and blob keys.
    assert_eq!(
        refused(&eq(op(80, &[int(7)]), float(1.0))),
        ExpError::Parameter
    );
}

// ---------------------------------------------------------------------
// Regular expressions.

#[test]
fn regex_matches_strings() {
    let rec = Rec::new().str("s", "Hello World").int("i", 1);
    let re = |flags: i64, pattern: &str, name: &str| {
        op(7, &[int(flags), raw(pattern), bin(T_STR, name)])
    };
    assert_eq!(truth(&re(1, "^Hel+o", "s"), &rec), Truth::True);
    assert_eq!(truth(&re(1, "^hello", "s"), &rec), Truth::False);
    assert_eq!(truth(&re(3, "^hello", "s"), &rec), Truth::True);
    // Basic syntax: `+` is a literal.
    assert_eq!(truth(&re(0, "Hel+o", "s"), &rec), Truth::False);
    assert_eq!(truth(&re(1, "x", "missing"), &rec), Truth::Unknown);
    assert_eq!(refused(&re(1, "(", "s")), ExpError::Parameter);
    assert_eq!(
        refused(&op(7, &[int(1), raw("x"), ibin("i")])),
        ExpError::Parameter
    );
}

// ---------------------------------------------------------------------
// Lists and maps.

#[test]
fn list_and_map_values() {
    let list = list_lit(vec![Value::Int(1), Value::str("a")]);
    let ordered = map_lit(1, vec![(Value::str("k"), Value::Int(1))]);
    let unordered = map_lit(0, vec![(Value::str("k"), Value::Int(1))]);
    let rec = Rec::new()
        .cdt("l", &list)
        .cdt("om", &ordered)
        .cdt("um", &unordered)
        .cdt("em", &map_lit(0, vec![]));
    let l = || bin(T_LIST, "l");
    assert_eq!(
        truth(&eq(l(), quote(vec![Value::Int(1), Value::str("a")])), &rec),
        Truth::True
    );
    assert_eq!(
        truth(&op(3, &[l(), quote(vec![Value::Int(1)])]), &rec),
        Truth::True
    );
    assert_eq!(
        truth(&op(5, &[l(), quote(vec![Value::Int(2)])]), &rec),
        Truth::True
    );
    // A wildcard in a literal matches the rest.
    assert_eq!(
        truth(&eq(l(), quote(vec![Value::Int(1), Value::Wildcard])), &rec),
        Truth::True
    );
    // Key-ordered maps compare; unordered ones (non-empty) are unknown.
    assert_eq!(
        truth(&eq(bin(T_MAP, "om"), enc(&ordered)), &rec),
        Truth::True
    );
    assert_eq!(
        truth(&eq(bin(T_MAP, "um"), enc(&unordered)), &rec),
        Truth::Unknown
    );
    assert_eq!(
        truth(&eq(bin(T_MAP, "em"), enc(&map_lit(0, vec![]))), &rec),
        Truth::True
    );
    // EXP_READ gives the list and map particles.
    assert_eq!(read(&l(), &rec), Ok(Some((20, enc(&list)))));
    assert_eq!(read(&bin(T_MAP, "om"), &rec), Ok(Some((19, enc(&ordered)))));
    assert_eq!(
        read(&quote(vec![Value::Int(3)]), &rec),
        Ok(Some((20, vec![0x91, 0x03])))
    );
}

#[test]
fn literals_are_canonical() {
    // A key-ordered map literal arriving unsorted is sorted.
    let unsorted = map_lit(
        1,
        vec![
            (Value::str("b"), Value::Int(2)),
            (Value::str("a"), Value::Int(1)),
        ],
    );
    let sorted = map_lit(
        1,
        vec![
            (Value::str("a"), Value::Int(1)),
            (Value::str("b"), Value::Int(2)),
        ],
    );
    assert_eq!(
        read(&enc(&unsorted), &empty()),
        Ok(Some((19, enc(&sorted))))
    );
    // QUOTE needs a list.
    assert_eq!(
        read(&op(126, &[int(1)]), &empty()),
        Err(ExpError::Parameter)
    );
}

#[test]
fn in_list_and_map_keys_values() {
    let rec = Rec::new()
        .int("i", 2)
        .cdt(
            "m",
            &map_lit(
                1,
                vec![
                    (Value::str("a"), Value::Int(1)),
                    (Value::str("b"), Value::Int(2)),
                ],
            ),
        )
        .cdt("l", &list_lit(vec![Value::Int(1)]));
    let items = quote(vec![Value::Int(1), Value::Int(2), Value::str("x")]);
    assert_eq!(
        truth(&op(9, &[ibin("i"), items.clone()]), &rec),
        Truth::True
    );
    assert_eq!(truth(&op(9, &[int(3), items.clone()]), &rec), Truth::False);
    assert_eq!(truth(&op(9, &[s("x"), items.clone()]), &rec), Truth::True);
    assert_eq!(truth(&op(9, &[ibin("none"), items]), &rec), Truth::Unknown);
    assert_eq!(refused(&op(9, &[int(1), int(1)])), ExpError::Parameter);
    assert_eq!(
        read(&op(101, &[bin(T_MAP, "m")]), &rec),
        Ok(Some((
            20,
            enc(&list_lit(vec![Value::str("a"), Value::str("b")]))
        )))
    );
    assert_eq!(
        read(&op(102, &[bin(T_MAP, "m")]), &rec),
        Ok(Some((
            20,
            enc(&list_lit(vec![Value::Int(1), Value::Int(2)]))
        )))
    );
    // Not a map: unknown.
    assert_eq!(
        read(&op(101, &[bin(T_LIST, "l")]), &rec),
        Err(ExpError::OpNotApplicable)
    );
}

// ---------------------------------------------------------------------
// cond, let, var.

#[test]
fn cond_picks_the_first_true_branch() {
    let rec = Rec::new().int("a", 5);
    let cond = |a: Vec<u8>| {
        op(
            123,
            &[
                op(5, &[a.clone(), int(0)]),
                s("negative"),
                eq(a, int(0)),
                s("zero"),
                s("positive"),
            ],
        )
    };
    assert_eq!(
        read(&cond(ibin("a")), &rec),
        Ok(Some((3, b"positive".to_vec())))
    );
    assert_eq!(read(&cond(int(0)), &rec), Ok(Some((3, b"zero".to_vec()))));
    assert_eq!(
        read(&cond(int(-1)), &rec),
        Ok(Some((3, b"negative".to_vec())))
    );
    // An unknown condition makes the whole cond unknown.
    assert_eq!(
        read(&cond(ibin("zz")), &rec),
        Err(ExpError::OpNotApplicable)
    );
    // Branches of one type; `unknown` fits any; a default is required.
    assert_eq!(
        read(&op(123, &[boolean(true), int(1), s("x")]), &rec),
        Err(ExpError::Parameter)
    );
    assert_eq!(
        read(&op(123, &[boolean(false), unknown(), int(2)]), &rec),
        Ok(Some((1, 2i64.to_be_bytes().to_vec())))
    );
    assert_eq!(
        read(&op(123, &[boolean(true), int(1)]), &rec),
        Err(ExpError::Parameter)
    );
}

#[test]
fn let_binds_in_order_with_scopes() {
    let rec = Rec::new().int("a", 5);
    let var = |name: &str| op(124, &[raw(name)]);
    // let x = a + 1, y = x * 2 in y - x
    let exp = op(
        125,
        &[
            raw("x"),
            op(20, &[ibin("a"), int(1)]),
            raw("y"),
            op(22, &[var("x"), int(2)]),
            op(21, &[var("y"), var("x")]),
        ],
    );
    assert_eq!(read_int(&exp, &rec), Some(6));
    // Nested scopes see outer variables; an inner scope's are gone after.
    let nested = op(
        125,
        &[
            raw("x"),
            int(1),
            op(
                20,
                &[
                    op(125, &[raw("z"), int(10), op(20, &[var("x"), var("z")])]),
                    var("x"),
                ],
            ),
        ],
    );
    assert_eq!(read_int(&nested, &rec), Some(12));
    let out_of_scope = op(
        125,
        &[
            raw("x"),
            int(1),
            op(20, &[op(125, &[raw("z"), int(10), var("z")]), var("z")]),
        ],
    );
    assert_eq!(read(&out_of_scope, &rec), Err(ExpError::Parameter));
    // Variables keep their definitions' types.
    assert_eq!(
        read(
            &op(125, &[raw("x"), int(1), op(20, &[var("x"), float(1.0)])]),
            &rec
        ),
        Err(ExpError::Parameter)
    );
    // Undefined, self-referencing, duplicate and ill-named variables.
    for bad in [
        op(125, &[raw("x"), int(1), var("y")]),
        op(125, &[raw("x"), var("x"), var("x")]),
        op(
            125,
            &[raw("x"), int(1), op(125, &[raw("x"), int(2), var("x")])],
        ),
        op(125, &[raw("1x"), int(1), int(1)]),
        op(125, &[raw(""), int(1), int(1)]),
        op(125, &[raw("x"), int(1)]),
    ] {
        assert_eq!(read(&bad, &rec), Err(ExpError::Parameter), "{bad:x?}");
    }
    // An unknown definition is unknown where it is used.
    let unknown_def = op(125, &[raw("x"), ibin("zz"), var("x")]);
    assert_eq!(read(&unknown_def, &rec), Err(ExpError::OpNotApplicable));
}

// ---------------------------------------------------------------------
// Module calls.

/// A CDT call `[127, ret, module, payload, target]`.
fn call(ret: u64, module: u64, payload: Vec<u8>, target: Vec<u8>) -> Vec<u8> {
    op(127, &[int(ret as i64), int(module as i64), payload, target])
}

#[test]
fn cdt_read_calls() {
    let list = list_lit(vec![Value::Int(3), Value::Int(1), Value::Int(2)]);
    let rec = Rec::new().cdt("l", &list).int("i", 1);
    let l = || bin(T_LIST, "l");
    // size
    let size = call(T_INT, 0, op(16, &[]), l());
    assert_eq!(read_int(&size, &rec), Some(3));
    assert_eq!(truth(&op(3, &[size.clone(), int(2)]), &rec), Truth::True);
    // get_by_index(VALUE, 1)
    let by_index = call(T_INT, 0, op(19, &[int(7), int(1)]), l());
    assert_eq!(read_int(&by_index, &rec), Some(1));
    // An evaluated argument: the index from a bin.
    let by_bin_index = call(T_INT, 0, op(19, &[int(7), ibin("i")]), l());
    assert_eq!(read_int(&by_bin_index, &rec), Some(1));
    // get_all_by_value_list(COUNT, quoted list)
    let by_values = call(
        T_INT,
        0,
        op(23, &[int(5), quote(vec![Value::Int(2), Value::Int(3)])]),
        l(),
    );
    assert_eq!(read_int(&by_values, &rec), Some(2));
    // A literal list as the collection.
    let on_literal = call(T_INT, 0, op(16, &[]), quote(vec![Value::Int(9)]));
    assert_eq!(read_int(&on_literal, &rec), Some(1));
    // A result of another type than declared is unknown.
    let wrong = call(T_STR, 0, op(16, &[]), l());
    assert_eq!(read(&wrong, &rec), Err(ExpError::OpNotApplicable));
    // A missing bin is unknown; an op error is unknown.
    assert_eq!(
        read(&call(T_INT, 0, op(16, &[]), bin(T_LIST, "zz")), &rec),
        Err(ExpError::OpNotApplicable)
    );
    assert_eq!(
        read(&call(T_INT, 0, op(19, &[int(7), int(10)]), l()), &rec),
        Err(ExpError::OpNotApplicable)
    );
    // A modifying op in a read call fails.
    assert_eq!(
        read(&call(T_LIST, 0, op(1, &[int(4)]), l()), &rec),
        Err(ExpError::OpNotApplicable)
    );
}

#[test]
fn cdt_calls_with_context_and_nesting() {
    let nested = list_lit(vec![
        list_lit(vec![Value::Int(1), Value::Int(2)]),
        list_lit(vec![Value::Int(7), Value::Int(8), Value::Int(9)]),
    ]);
    let rec = Rec::new().cdt("n", &nested);
    // size of element 1: [0xff, [0x10, 1], [16]]
    let mut payload = header(3);
    payload.extend(int(0xff));
    payload.extend(enc(&list_lit(vec![Value::Int(0x10), Value::Int(1)])));
    payload.extend(op(16, &[]));
    let size = call(T_INT, 0, payload, bin(T_LIST, "n"));
    assert_eq!(read_int(&size, &rec), Some(3));
    // A call on the result of another call: get_by_index(VALUE, 0) of
    // get_by_index(VALUE, 1).
    let inner = call(T_LIST, 0, op(19, &[int(7), int(1)]), bin(T_LIST, "n"));
    let outer = call(T_INT, 0, op(19, &[int(7), int(0)]), inner);
    assert_eq!(read_int(&outer, &rec), Some(7));
}

#[test]
fn cdt_modify_calls_answer_the_new_collection() {
    let rec = Rec::new().cdt("l", &list_lit(vec![Value::Int(1)]));
    // append(5) on the bin: the value is the list after the append; the
    // bin itself is untouched.
    let append = call(T_LIST, 0x40, op(1, &[int(5)]), bin(T_LIST, "l"));
    assert_eq!(
        read(&append, &rec),
        Ok(Some((
            20,
            enc(&list_lit(vec![Value::Int(1), Value::Int(5)]))
        )))
    );
    assert_eq!(
        rec.bin(b"l").map(|(_, b)| b.to_vec()),
        Some(vec![0x91, 0x01])
    );
    // Appending to nil creates a list.
    let create = call(T_LIST, 0x40, op(1, &[s("x")]), nil());
    assert_eq!(
        read(&create, &rec),
        Ok(Some((20, enc(&list_lit(vec![Value::str("x")])))))
    );
    // Size of the appended list.
    let size = call(T_INT, 0, op(16, &[]), append);
    assert_eq!(read_int(&size, &rec), Some(2));
}

#[test]
fn call_shapes_refused_at_parse() {
    let l = || bin(T_LIST, "l");
    for (bad, expected) in [
        // Bin argument of the wrong type for the module.
        (call(T_INT, 0, op(16, &[]), ibin("i")), ExpError::Parameter),
        (
            call(T_INT, 1, op(51, &[int(0), int(8)]), l()),
            ExpError::Parameter,
        ),
        (call(T_INT, 2, op(50, &[]), l()), ExpError::Parameter),
        // Unknown module, return type, empty payload.
        (call(T_INT, 7, op(16, &[]), l()), ExpError::Parameter),
        (call(12, 0, op(16, &[]), l()), ExpError::Parameter),
        (call(T_INT, 0, header(0), l()), ExpError::Parameter),
        // The string module (servers 8.2+) is refused with 4, as the
        // reference (8.1.2) refuses it (the Rust client's suite,
        // example_expression_operations); a path needs a context, an
        // and-filter a step before it, and the modify flag exactly when it
        // applies.
        (call(T_INT, 3, op(16, &[]), s("x")), ExpError::Parameter),
        (
            call(T_LIST, 0, op(0xfe, &[enc(&list_lit(vec![])), int(0)]), l()),
            ExpError::Parameter,
        ),
        (
            call(
                T_LIST,
                0,
                op(
                    0xfe,
                    &[
                        enc(&list_lit(vec![
                            Value::Int(0x204),
                            list_lit(vec![Value::Bool(true)]),
                        ])),
                        int(1),
                    ],
                ),
                l(),
            ),
            ExpError::Parameter,
        ),
        (
            call(
                T_LIST,
                0x40,
                op(
                    0xfe,
                    &[
                        enc(&list_lit(vec![Value::Int(4), Value::Bool(true)])),
                        int(1),
                    ],
                ),
                l(),
            ),
            ExpError::Parameter,
        ),
    ] {
        assert_eq!(read(&bad, &empty()), Err(expected), "{bad:x?}");
    }
}

// ---------------------------------------------------------------------
// EXP_READ results.

#[test]
fn read_results_are_particles() {
    let rec = Rec::new()
        .with("h", 18, vec![1, 2, 3])
        .with("g", 23, b"\0\0\0{}".to_vec());
    assert_eq!(
        read(&int(-2), &rec),
        Ok(Some((1, (-2i64).to_be_bytes().to_vec())))
    );
    assert_eq!(
        read(&float(1.5), &rec),
        Ok(Some((2, 1.5f64.to_bits().to_be_bytes().to_vec())))
    );
    assert_eq!(read(&s("hi"), &rec), Ok(Some((3, b"hi".to_vec()))));
    assert_eq!(read(&blob(&[9]), &rec), Ok(Some((4, vec![9]))));
    assert_eq!(read(&boolean(true), &rec), Ok(Some((17, vec![1]))));
    assert_eq!(read(&nil(), &rec), Ok(None));
    assert_eq!(read(&bin(9, "h"), &rec), Ok(Some((18, vec![1, 2, 3]))));
    assert_eq!(
        read(&bin(8, "g"), &rec),
        Ok(Some((23, b"\0\0\0{}".to_vec())))
    );
    assert_eq!(
        read(&enc(&Value::Geo(b"{\"type\":\"Point\"}".to_vec())), &rec),
        Ok(Some((23, b"\0\0\0{\"type\":\"Point\"}".to_vec())))
    );
    // `unknown` and `result_remove` are no values.
    assert_eq!(read(&unknown(), &rec), Err(ExpError::OpNotApplicable));
    assert_eq!(read(&op(100, &[]), &rec), Err(ExpError::OpNotApplicable));
    // Builtin variables are bound only inside CDT selections.
    assert_eq!(
        read(&op(122, &[int(2), int(2)]), &rec),
        Err(ExpError::OpNotApplicable)
    );
    assert_eq!(
        read(&op(122, &[int(3), int(2)]), &rec),
        Err(ExpError::Parameter)
    );
    assert_eq!(
        read(&op(122, &[int(3), int(3)]), &rec),
        Err(ExpError::Parameter)
    );
}

#[test]
fn strings_are_bytes_as_stored() {
    // The server stores a string bin's bytes as sent, UTF-8 or not (the Go
    // and C clients can send any bytes); expressions read, compare and
    // write them back as they are, as the reference does.
    let raw_bytes = vec![b'a', 0xff, 0xfe];
    let rec = Rec::new().with("s", 3, raw_bytes.clone());
    assert_eq!(
        read(&bin(T_STR, "s"), &rec),
        Ok(Some((3, raw_bytes.clone())))
    );
    let literal = {
        let mut out = vec![0xa4, 3];
        out.extend_from_slice(&raw_bytes);
        out
    };
    assert_eq!(
        truth(&eq(bin(T_STR, "s"), literal.clone()), &rec),
        Truth::True
    );
    assert_eq!(read(&literal, &rec), Ok(Some((3, raw_bytes.clone()))));
    assert_eq!(
        modify(&bin(T_STR, "s"), 0, "t", &rec),
        Ok(BinWrite::Store(3, raw_bytes))
    );
}

#[test]
fn op_payload_shapes_and_flags() {
    let rec = empty();
    let mut one = header(1);
    one.extend(int(4));
    assert_eq!(
        read_op(&one, &rec, NOW_MS),
        Ok(Some((1, 4i64.to_be_bytes().to_vec())))
    );
    let mut three = header(3);
    three.extend(int(4));
    three.extend(int(0));
    three.extend(int(0));
    assert_eq!(read_op(&three, &rec, NOW_MS), Err(ExpError::Parameter));
    assert_eq!(read_op(&header(0), &rec, NOW_MS), Err(ExpError::Parameter));
    assert_eq!(read_op(&int(4), &rec, NOW_MS), Err(ExpError::Parameter));
    // Read ops take only EVAL_NO_FAIL.
    let mut flagged = header(2);
    flagged.extend(int(4));
    flagged.push(0x01);
    assert_eq!(read_op(&flagged, &rec, NOW_MS), Err(ExpError::Parameter));
    let mut modify = header(2);
    modify.extend(int(4));
    modify.extend(int(0x20));
    assert_eq!(
        modify_op(&modify, b"x", &rec, NOW_MS),
        Err(ExpError::Parameter)
    );
}

// ---------------------------------------------------------------------
// EXP_MODIFY.

fn modify(exp: &[u8], flags: u64, bin_name: &str, rec: &Rec) -> Result<BinWrite, ExpError> {
    let mut payload = header(2);
    payload.extend_from_slice(exp);
    payload.extend(int(flags as i64));
    modify_op(&payload, bin_name.as_bytes(), rec, NOW_MS)
}

#[test]
fn modify_stores_results() {
    let rec = Rec::new().int("a", 5);
    assert_eq!(
        modify(&op(20, &[ibin("a"), int(1)]), 0, "a", &rec),
        Ok(BinWrite::Store(1, 6i64.to_be_bytes().to_vec()))
    );
    assert_eq!(
        modify(&op(3, &[ibin("a"), int(1)]), 0, "b", &rec),
        Ok(BinWrite::Store(17, vec![1]))
    );
    assert_eq!(
        modify(&quote(vec![Value::Int(1)]), 0, "b", &rec),
        Ok(BinWrite::Store(20, vec![0x91, 1]))
    );
}

#[test]
fn modify_bin_policies() {
    let rec = Rec::new().int("a", 5);
    let exp = int(1);
    assert_eq!(
        modify(&exp, CREATE_ONLY, "a", &rec),
        Err(ExpError::BinExists)
    );
    assert_eq!(
        modify(&exp, CREATE_ONLY | POLICY_NO_FAIL, "a", &rec),
        Ok(BinWrite::Keep)
    );
    assert_eq!(
        modify(&exp, CREATE_ONLY, "b", &rec),
        Ok(BinWrite::Store(1, 1i64.to_be_bytes().to_vec()))
    );
    assert_eq!(
        modify(&exp, UPDATE_ONLY, "b", &rec),
        Err(ExpError::BinNotFound)
    );
    assert_eq!(
        modify(&exp, UPDATE_ONLY | POLICY_NO_FAIL, "b", &rec),
        Ok(BinWrite::Keep)
    );
    // The policy is checked before the expression is evaluated.
    assert_eq!(
        modify(&ibin("missing"), CREATE_ONLY, "a", &rec),
        Err(ExpError::BinExists)
    );
}

#[test]
fn modify_nil_and_failures() {
    let rec = Rec::new().int("a", 5);
    assert_eq!(modify(&nil(), 0, "a", &rec), Err(ExpError::OpNotApplicable));
    assert_eq!(
        modify(&nil(), ALLOW_DELETE, "a", &rec),
        Ok(BinWrite::Delete)
    );
    assert_eq!(
        modify(&nil(), POLICY_NO_FAIL, "a", &rec),
        Ok(BinWrite::Keep)
    );
    // Nothing to delete.
    assert_eq!(modify(&nil(), 0, "b", &rec), Ok(BinWrite::Keep));
    // Evaluation failures.
    assert_eq!(
        modify(&ibin("zz"), 0, "a", &rec),
        Err(ExpError::OpNotApplicable)
    );
    assert_eq!(
        modify(&ibin("zz"), EVAL_NO_FAIL, "a", &rec),
        Ok(BinWrite::Keep)
    );
    assert_eq!(
        modify(&ibin("zz"), POLICY_NO_FAIL, "a", &rec),
        Err(ExpError::OpNotApplicable)
    );
    // A map keeping its selection order is no storable map.
    let preserved = map_lit(8, vec![(Value::str("k"), Value::Int(1))]);
    assert_eq!(
        modify(&enc(&preserved), 0, "m", &rec),
        Err(ExpError::IncompatibleType)
    );
    assert_eq!(
        modify(&enc(&preserved), POLICY_NO_FAIL, "m", &rec),
        Ok(BinWrite::Keep)
    );
    // Parse errors come first.
    assert_eq!(
        modify(&op(200, &[]), EVAL_NO_FAIL, "a", &rec),
        Err(ExpError::Parameter)
    );
}

// ---------------------------------------------------------------------
// Limits and malformed input.

#[test]
fn nesting_is_bounded() {
    let nested = |depth: usize| {
        let mut exp = boolean(true);
        for _ in 0..depth {
            exp = op(18, &[exp]);
        }
        exp
    };
    assert_eq!(truth(&nested(63), &empty()), Truth::False);
    assert_eq!(truth(&nested(62), &empty()), Truth::True);
    assert_eq!(refused(&nested(64)), ExpError::Parameter);
    assert_eq!(refused(&nested(10_000)), ExpError::Parameter);
}

#[test]
fn size_is_bounded() {
    let mut big = vec![0xdb];
    let text_len = parse::MAX_SIZE;
    big.extend_from_slice(&(text_len as u32).to_be_bytes());
    big.push(3);
    big.extend(std::iter::repeat_n(b'a', text_len - 1));
    let exp = eq(s("a"), big);
    assert_eq!(refused(&exp), ExpError::Parameter);
}

/// `[125, name, definition, ..., body]`.
fn let_exp(defs: Vec<(&str, Vec<u8>)>, body: Vec<u8>) -> Vec<u8> {
    let mut out = header(2 * defs.len() + 2);
    out.extend(int(125));
    for (name, def) in defs {
        out.extend(raw(name));
        out.extend(def);
    }
    out.extend(body);
    out
}

fn var(name: &str) -> Vec<u8> {
    op(124, &[raw(name)])
}

#[test]
fn values_an_evaluation_produces_are_bounded() {
    // A bit resize on nil makes a zeroed blob of that many bytes.
    const MIB: i64 = 1 << 20;
    let blob_of = |bytes: i64| call(T_BLOB, 0x41, op(0, &[int(bytes)]), nil());
    // Blobs well under the bound evaluate.
    // (Results are compared by length: a failure must not print them.)
    let answer = |exp: &[u8]| read(exp, &empty()).map(|r| r.map(|(p, b)| (p, b.len())));
    let small = let_exp(vec![("a", blob_of(MIB))], var("a"));
    assert_eq!(answer(&small), Ok(Some((4, 1 << 20))));
    // `let` keeps every definition alive at once: each is well under the
    // bound, together they are not (without a bound, a 1 MiB expression
    // holds tens of thousands of 128 MiB blobs).
    let many = let_exp(
        vec![
            ("a", blob_of(60 * MIB)),
            ("b", blob_of(60 * MIB)),
            ("c", blob_of(60 * MIB)),
        ],
        var("c"),
    );
    assert_eq!(answer(&many), Err(ExpError::OpNotApplicable));
    // A filter whose body ignores the definitions fails too: running out
    // is an evaluation failure, never a silent pass.
    let ignored = let_exp(
        vec![
            ("a", blob_of(60 * MIB)),
            ("b", blob_of(60 * MIB)),
            ("c", blob_of(60 * MIB)),
        ],
        boolean(true),
    );
    assert_eq!(truth(&ignored, &empty()), Truth::Unknown);
    // Every use of a variable copies its value: many uses of one big
    // value are bounded the same way.
    let uses: Vec<Vec<u8>> = (0..8).map(|_| op(1, &[var("a"), var("a")])).collect();
    let copies = let_exp(vec![("a", blob_of(20 * MIB))], op(16, &uses));
    assert_eq!(truth(&copies, &empty()), Truth::Unknown);
    let few = let_exp(vec![("a", blob_of(MIB))], op(16, &uses));
    assert_eq!(truth(&few, &empty()), Truth::True);
}

#[test]
fn unknown_op_codes_and_shapes_are_refused() {
    for bad in [
        header(0),
        op(10, &[]),
        op(42, &[int(1)]),
        op(129, &[]),
        enc(&Value::Ext(1, vec![0])),
        vec![0xc1],
        vec![0xa0],
        enc(&Value::Blob(9, vec![1])),
        // Trailing bytes.
        [boolean(true), boolean(true)].concat(),
        // Negative op code.
        vec![0x91, 0xff],
    ] {
        assert!(Expression::parse(&bad).is_err(), "{bad:x?}");
    }
}

/// Expressions covering every op family, for the malformed-input tests.
fn corpus() -> Vec<Vec<u8>> {
    let l = || bin(T_LIST, "l");
    vec![
        eq(ibin("a"), int(5)),
        op(16, &[eq(ibin("a"), int(5)), op(18, &[boolean(false)])]),
        op(7, &[int(3), raw("^a.*"), bin(T_STR, "s")]),
        op(
            3,
            &[op(20, &[ibin("a"), int(2), int(3)]), op(23, &[int(8)])],
        ),
        op(
            5,
            &[
                op(24, &[float(2.0), float(3.0)]),
                op(25, &[float(8.0), float(2.0)]),
            ],
        ),
        eq(op(40, &[op(36, &[int(1), int(3)]), boolean(true)]), int(60)),
        op(3, &[op(64, &[int(3)]), op(69, &[])]),
        eq(op(70, &[]), s("demo")),
        op(
            125,
            &[
                raw("x"),
                ibin("a"),
                op(
                    123,
                    &[
                        op(3, &[op(124, &[raw("x")]), int(1)]),
                        boolean(true),
                        boolean(false),
                    ],
                ),
            ],
        ),
        op(9, &[ibin("a"), quote(vec![Value::Int(5), Value::str("x")])]),
        eq(
            call(
                T_INT,
                0,
                op(19, &[int(7), op(20, &[ibin("a"), int(-4)])]),
                l(),
            ),
            int(2),
        ),
        eq(call(T_LIST, 0x40, op(1, &[s("z")]), l()), quote(vec![])),
        eq(
            bin(T_MAP, "m"),
            enc(&map_lit(1, vec![(Value::str("k"), Value::Int(1))])),
        ),
        eq(op(101, &[bin(T_MAP, "m")]), quote(vec![Value::str("k")])),
    ]
}

fn corpus_record() -> Rec {
    Rec::new()
        .int("a", 5)
        .str("s", "abc")
        .cdt(
            "l",
            &list_lit(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
        )
        .cdt("m", &map_lit(1, vec![(Value::str("k"), Value::Int(1))]))
}

#[test]
fn corpus_expressions_parse_and_evaluate() {
    let rec = corpus_record();
    for exp in corpus() {
        let parsed = Expression::parse(&exp).expect("parses");
        assert_ne!(parsed.filter(&rec, NOW_MS), Truth::Unknown, "{exp:x?}");
    }
}

#[test]
fn truncations_are_refused_without_panic() {
    let rec = corpus_record();
    for exp in corpus() {
        for end in 0..exp.len() {
            assert!(
                Expression::parse(&exp[..end]).is_err(),
                "{:x?}",
                &exp[..end]
            );
            let mut payload = header(2);
            payload.extend_from_slice(&exp[..end]);
            assert!(read_op(&payload, &rec, NOW_MS).is_err());
            assert!(modify_op(&payload, b"a", &rec, NOW_MS).is_err());
        }
    }
}

#[test]
fn mutations_never_panic() {
    let rec = corpus_record();
    // A small deterministic generator (xorshift).
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for exp in corpus() {
        for _ in 0..400 {
            let mut bytes = exp.clone();
            let edits = 1 + next() % 3;
            for _ in 0..edits {
                let at = (next() as usize) % bytes.len();
                match next() % 3 {
                    0 => bytes[at] = next() as u8,
                    1 => {
                        bytes.remove(at);
                        if bytes.is_empty() {
                            bytes.push(0xc0);
                        }
                    }
                    _ => bytes.insert(at, next() as u8),
                }
            }
            if let Ok(parsed) = Expression::parse(&bytes) {
                let _ = parsed.filter(&rec, NOW_MS);
            }
            let mut payload = header(2);
            payload.extend_from_slice(&bytes);
            payload.push(0x10);
            let _ = read_op(&payload, &rec, NOW_MS);
            let _ = modify_op(&payload, b"a", &rec, NOW_MS);
        }
    }
}

#[test]
fn scalar_reads_borrow_the_record_and_the_expression() {
    use std::borrow::Cow;
    // The common filter's values point into the record and the tree; only
    // collections decoded for comparison and module calls allocate.
    let rec = Rec::new().str("s", "abc").int("i", 3);
    let cases = [bin(T_STR, "s"), op(70, &[]), s("lit")];
    for exp in cases {
        let parsed = Expression::parse_any(&exp).expect("parses");
        assert!(
            matches!(
                parsed.evaluate(&rec, NOW_MS),
                eval::Val::Str(Cow::Borrowed(_))
            ),
            "{exp:x?}"
        );
    }
    let parsed = Expression::parse(&op(4, &[ibin("i"), int(3)])).expect("parses");
    assert_eq!(parsed.slots, 0, "no variable slots to allocate");
    assert_eq!(parsed.filter(&rec, NOW_MS), Truth::True);
}

// ---------------------------------------------------------------------
// Path expressions (CDT SELECT, op 0xfe), with the bytes the official
// clients send.

fn days() -> Value {
    let day = |entries: &[(&str, f64)]| {
        map_lit(
            0,
            entries
                .iter()
                .map(|(k, v)| (Value::str(k), Value::Double(*v)))
                .collect(),
        )
    };
    map_lit(
        0,
        vec![
            (Value::str("Day1"), day(&[("book", 14.99), ("ferry", 5.0)])),
            (Value::str("Day2"), day(&[("food", 34.0), ("game", 12.99)])),
            (
                Value::str("Day3"),
                day(&[("plants", 19.99), ("stickers", 2.0)]),
            ),
        ],
    )
}

/// Bytes written as hex pairs.
fn hex(text: &str) -> Vec<u8> {
    text.split_whitespace()
        .map(|pair| u8::from_str_radix(pair, 16).expect("valid"))
        .collect()
}

#[test]
fn path_expressions_select_and_modify_with_loop_variables() {
    let rec = Rec::new().cdt("m", &days()).int("i", 3);
    // SelectByPath(LIST, VALUE, [all children, all children where
    // float value >= 20.0], map bin m).
    let select = hex(
        "95 7f 04 00 93 cc fe 94 04 c3 04 93 04 93 7a 07 01 cb 40 34 00 00 00 00 00 00 01 \
         93 51 05 a1 6d",
    );
    let expected = enc(&list_lit(vec![Value::Double(34.0)]));
    assert_eq!(read(&select, &rec), Ok(Some((20, expected))));
    // ModifyByPath(MAP, [all, all], float value - 5.0, map bin m): the
    // whole map with every leaf rewritten.
    let modify = hex(
        "95 7f 05 40 94 cc fe 94 04 c3 04 c3 04 93 15 93 7a 07 01 cb 40 14 00 00 00 00 00 00 \
         93 51 05 a1 6d",
    );
    let Ok(Some((19, bytes))) = read(&modify, &rec) else {
        panic!("a map");
    };
    let Value::Map(modified) = value::decode(&bytes).expect("valid") else {
        panic!("a map");
    };
    let Value::Map(day2) = &modified.entries[1].1 else {
        panic!("a map");
    };
    assert_eq!(
        value::to_bytes(&day2.entries[0].1),
        enc(&Value::Double(29.0))
    );
    // A loop variable outside a path, or of another type than asked, is
    // unknown; a select on a bin that is no collection is unknown.
    assert_eq!(read_int(&op(122, &[int(2), int(1)]), &rec), None);
    let as_int = hex("95 7f 04 00 93 cc fe 94 04 c3 04 93 04 93 7a 02 01 02 01 93 51 05 a1 6d");
    assert_eq!(read(&as_int, &rec), Err(ExpError::OpNotApplicable));
    let on_int = hex("95 7f 04 00 93 cc fe 92 04 c3 01 93 51 02 a1 69");
    assert_eq!(read(&on_int, &rec), Err(ExpError::Parameter));
}

#[test]
fn the_op_form_selects_and_applies_on_the_bin() {
    let rec = Rec::new();
    let bin = value::to_bytes(&days());
    // [0xfe, [all, all], MAP_KEY]
    let keys = hex("93 cc fe 94 04 c3 04 c3 02");
    let outcome = path_op(&keys, Some((19, &bin)), false, &rec, NOW_MS).expect("valid");
    let names = ["book", "ferry", "food", "game", "plants", "stickers"];
    let expected = enc(&list_lit(names.iter().map(|k| Value::str(k)).collect()));
    assert_eq!(outcome.result, Some((20, expected)));
    assert!(outcome.bin.is_none());
    // An apply under CDT_READ, a select under CDT_MODIFY, a scalar bin.
    let remove = hex("94 cc fe 94 04 c3 04 c3 04 91 64");
    assert_eq!(
        path_op(&remove, Some((19, &bin)), false, &rec, NOW_MS).expect_err("refused"),
        ResultCode::Parameter
    );
    assert_eq!(
        path_op(&keys, Some((19, &bin)), true, &rec, NOW_MS).expect_err("refused"),
        ResultCode::Parameter
    );
    assert_eq!(
        path_op(
            &keys,
            Some((1, &[0, 0, 0, 0, 0, 0, 0, 1])),
            false,
            &rec,
            NOW_MS
        )
        .expect_err("refused"),
        ResultCode::IncompatibleType
    );
    // Remove every leaf: the days stay, empty.
    let outcome = path_op(&remove, Some((19, &bin)), true, &rec, NOW_MS).expect("valid");
    let empty_days = map_lit(
        0,
        ["Day1", "Day2", "Day3"]
            .iter()
            .map(|d| (Value::str(d), map_lit(0, vec![])))
            .collect(),
    );
    assert_eq!(outcome.bin, Some((19, enc(&empty_days))));
    assert!(outcome.result.is_none());
    // No bin: nothing selected, nothing written.
    let outcome = path_op(&keys, None, false, &rec, NOW_MS).expect("valid");
    assert!(outcome.result.is_none() && outcome.bin.is_none());
}

#[test]
fn a_modify_that_copies_a_big_value_into_every_leaf_is_bounded() {
    let rec = Rec::new();
    let leaves = list_lit((0..8_000).map(Value::Int).collect());
    let bin = value::to_bytes(&leaves);
    // [0xfe, [all children], APPLY, "x" * 20 000]: 160 MB of copies.
    let mut payload = hex("94 cc fe 92 04 c3 04");
    payload.extend(s(&"x".repeat(20_000)));
    assert_eq!(
        path_op(&payload, Some((20, &bin)), true, &rec, NOW_MS).expect_err("too big"),
        ResultCode::RecordTooBig
    );
    // A small one is fine.
    let mut payload = hex("94 cc fe 92 04 c3 04");
    payload.extend(s("x"));
    let outcome = path_op(&payload, Some((20, &bin)), true, &rec, NOW_MS).expect("applies");
    let expected = list_lit(vec![Value::str("x"); 8_000]);
    assert_eq!(outcome.bin, Some((20, enc(&expected))));
}
