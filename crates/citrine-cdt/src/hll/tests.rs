//! Tests of HLL ops end to end (payload bytes in, bin and result particle
//! out), of the sketch layout, and of estimates against known counts.
//! Values are encoded as the official clients send them (strings with the
//! particle prefix 3), so the exact counts the reference's own client
//! tests expect can be checked here.

use super::sketch::{self, Check, Shape, Sketch};
use super::{operate, CREATE_ONLY, NO_FAIL, UPDATE_ONLY};
use crate::value::{self, List, Value};
use crate::CdtError;
use citrine_types::ParticleType;

const HLL: u8 = ParticleType::Hll as u8;
const ALLOW_FOLD: i64 = super::ALLOW_FOLD as i64;

fn list(items: Vec<Value>) -> Value {
    Value::List(List { flags: 0, items })
}

fn payload(code: i64, args: Vec<Value>) -> Vec<u8> {
    let mut op = vec![Value::Int(code)];
    op.extend(args);
    value::to_bytes(&list(op))
}

fn strs<I: IntoIterator<Item = String>>(items: I) -> Value {
    list(
        items
            .into_iter()
            .map(|s| Value::Str(s.into_bytes()))
            .collect(),
    )
}

/// `"key{i}"` for i in `range`, as the Python client's tests name them.
fn keys(range: std::ops::Range<u32>) -> Value {
    strs(range.map(|i| format!("key{i}")))
}

fn blobs(sketches: &[&[u8]]) -> Value {
    list(
        sketches
            .iter()
            .map(|s| Value::Blob(HLL, s.to_vec()))
            .collect(),
    )
}

type Particle = (u8, Vec<u8>);

/// Runs a modify op; returns the new bin bytes and the result.
fn modify(
    bin: Option<&[u8]>,
    payload: &[u8],
) -> Result<(Option<Vec<u8>>, Option<Particle>), CdtError> {
    let outcome = operate(payload, bin.map(|b| (HLL, b)), true)?;
    let bin = outcome.bin.map(|(particle, bytes)| {
        assert_eq!(particle, HLL);
        bytes
    });
    Ok((bin, outcome.result))
}

fn read(bin: &[u8], payload: &[u8]) -> Result<Particle, CdtError> {
    let outcome = operate(payload, Some((HLL, bin)), false)?;
    assert!(outcome.bin.is_none());
    Ok(outcome.result.expect("a read answers"))
}

fn as_int(particle: &Particle) -> u64 {
    assert_eq!(particle.0, ParticleType::Integer as u8);
    u64::from_be_bytes(particle.1.clone().try_into().expect("8 bytes"))
}

fn as_float(particle: &Particle) -> f64 {
    assert_eq!(particle.0, ParticleType::Float as u8);
    f64::from_bits(u64::from_be_bytes(
        particle.1.clone().try_into().expect("8 bytes"),
    ))
}

/// A new bin holding `values`, made by ADD with the given bit counts.
fn added(values: Value, p: i64, q: i64) -> Vec<u8> {
    let (bin, _) = modify(
        None,
        &payload(1, vec![values, Value::Int(p), Value::Int(q), Value::Int(0)]),
    )
    .expect("add");
    bin.expect("a bin")
}

fn count(bin: &[u8]) -> u64 {
    as_int(&read(bin, &payload(50, vec![])).expect("count"))
}

fn describe(bin: &[u8]) -> (i64, i64) {
    let (particle, bytes) = read(bin, &payload(55, vec![])).expect("describe");
    assert_eq!(particle, ParticleType::List as u8);
    match value::decode(&bytes).expect("a list") {
        Value::List(l) => match l.items.as_slice() {
            [Value::Int(p), Value::Int(q)] => (*p, *q),
            other => panic!("describe answered {other:?}"),
        },
        other => panic!("describe answered {other:?}"),
    }
}

fn within(actual: u64, expected: u64, fraction: f64) -> bool {
    (actual as f64 - expected as f64).abs() <= expected as f64 * fraction
}

// ---- layout ----

#[test]
fn particle_sizes_and_header_match_the_reference_layout() {
    // 11 header bytes, then 2^p registers of 6 + q bits.
    for (p, q, len) in [
        (4, 0, 11 + 12),
        (4, 4, 11 + 20),
        (8, 0, 11 + 192),
        (6, 12, 11 + 144),
        (14, 0, 11 + 12288),
        (16, 48, 11 + 442_368),
        (9, 51, 11 + 3648),
    ] {
        let (bin, result) = modify(
            None,
            &payload(0, vec![Value::Int(p), Value::Int(q), Value::Int(0)]),
        )
        .expect("init");
        assert!(result.is_none(), "init answers nothing");
        let bin = bin.expect("init creates the bin");
        assert_eq!(bin.len(), len, "({p}, {q})");
        assert_eq!(&bin[..3], &[0, p as u8, q as u8]);
        assert!(bin[3..].iter().all(|&b| b == 0));
        assert_eq!(describe(&bin), (p, q));
        assert!(super::valid_particle(&bin));
    }
}

#[test]
fn registers_pack_msb_first_without_disturbing_neighbours() {
    for q in [0u8, 4, 7, 12, 51] {
        let mut sketch = Sketch::new(Shape { p: 4, q });
        let width = 6 + u32::from(q);
        let max = (1u64 << width) - 1;
        for r in 0..16 {
            sketch.set(r, max);
            for other in 0..16 {
                let expected = if other <= r { max } else { 0 };
                assert_eq!(sketch.get(other), expected, "q {q} r {r} other {other}");
            }
        }
        // Register 0 is the first `width` bits of the register bytes.
        let mut one = Sketch::new(Shape { p: 4, q });
        one.set(0, 1 << (width - 1));
        assert_eq!(one.to_bytes()[sketch::HEADER_LEN], 0x80);
        let mut last = Sketch::new(Shape { p: 4, q });
        last.set(15, 1);
        let bytes = last.to_bytes();
        let total_bits = 16 * width as usize;
        let pad = (8 - total_bits % 8) % 8;
        assert_eq!(bytes[bytes.len() - 1], 1 << pad);
    }
}

#[test]
fn parse_refuses_bad_headers_and_lengths() {
    let good = Sketch::new(Shape { p: 8, q: 0 }).to_bytes();
    assert!(Sketch::parse(&good, Check::Stored).is_some());
    let mut flagged = good.clone();
    flagged[0] = 1;
    assert!(Sketch::parse(&flagged, Check::Stored).is_none());
    assert!(Sketch::parse(&good[..good.len() - 1], Check::Stored).is_none());
    let mut bad_p = good.clone();
    bad_p[1] = 3;
    assert!(Sketch::parse(&bad_p, Check::Stored).is_none());
    assert!(Sketch::parse(&[], Check::Stored).is_none());
    // 16 + 51 bits: allowed as an argument, never stored.
    let wide = Sketch::new(Shape { p: 16, q: 51 }).to_bytes();
    assert!(Sketch::parse(&wide, Check::Argument).is_some());
    assert!(Sketch::parse(&wide, Check::Stored).is_none());
}

// ---- counts the reference's client tests expect ----

#[test]
fn refresh_count_of_100_keys_at_8_bits_is_97() {
    // aerospike-client-python test_hll.py: test_pos_hll_refresh_count.
    let bin = added(keys(0..100), 8, -1);
    let (after, result) = modify(Some(&bin), &payload(3, vec![])).expect("refresh");
    assert_eq!(as_int(&result.expect("a count")), 97);
    let after = after.expect("the bin is written back");
    // The count is cached in the header, little-endian.
    assert_eq!(&after[3..11], &97u64.to_le_bytes());
    assert_eq!(&after[11..], &bin[11..]);
    assert_eq!(count(&after), 97);
}

#[test]
fn union_and_intersect_counts_match_the_reference_client_tests() {
    // Record x of the Python suite: hll_bin = key0..=x at 8 bits,
    // hll_binu = key6..=key10 at 10 bits, mh_bin = key0..=x at (6, 12).
    let hll_bins: Vec<Vec<u8>> = (0..5).map(|x| added(keys(0..x + 1), 8, -1)).collect();
    let hll_binu = added(strs((6..11).map(|i| format!("key{i}"))), 10, -1);
    let mh_bins: Vec<Vec<u8>> = (0..5).map(|x| added(keys(0..x + 1), 6, 12)).collect();

    // test_pos_hll_get_union_count: hll_binu with every record's hll_bin.
    let all: Vec<&[u8]> = hll_bins.iter().map(Vec::as_slice).collect();
    let union_count = read(&hll_binu, &payload(52, vec![blobs(&all)])).expect("union count");
    assert_eq!(as_int(&union_count), 10);

    // test_pos_hll_get_intersect_count_mh: record 4's mh_bin with records
    // 0..4's.
    let firsts: Vec<&[u8]> = mh_bins[..4].iter().map(Vec::as_slice).collect();
    let intersect = read(&mh_bins[4], &payload(53, vec![blobs(&firsts)])).expect("intersect");
    assert_eq!(as_int(&intersect), 1);

    // test_pos_hll_get_union: the union of hll_bin and hll_binu shares 5
    // elements with each.
    let (kind, union) =
        read(&hll_bins[4], &payload(51, vec![blobs(&[&hll_binu])])).expect("get union");
    assert_eq!(kind, HLL);
    assert_eq!(describe(&union), (8, 0));
    for bin in [&hll_bins[4], &hll_binu] {
        let n = read(bin, &payload(53, vec![blobs(&[&union])])).expect("intersect");
        assert_eq!(as_int(&n), 5);
    }

    // test_pos_hll_set_union, first case: hll_bin |= hll_binu.
    let (set, result) = modify(
        Some(&hll_bins[4]),
        &payload(2, vec![blobs(&[&hll_binu]), Value::Int(0)]),
    )
    .expect("set union");
    assert!(result.is_none());
    let set = set.expect("a bin");
    assert_eq!(set, union, "set_union stores what get_union answers");
    let n = read(&set, &payload(53, vec![blobs(&[&set])])).expect("intersect");
    assert_eq!(as_int(&n), 10);
    let n = read(&hll_binu, &payload(53, vec![blobs(&[&set])])).expect("intersect");
    assert_eq!(as_int(&n), 5);
}

#[test]
fn set_union_folds_only_when_allowed() {
    // test_neg_hll_set_union / test_pos_hll_set_union, second case: an
    // empty 10-bit bin with 8-bit sketches.
    let (hll_bine, _) = modify(None, &payload(0, vec![Value::Int(10)])).expect("init");
    let hll_bine = hll_bine.expect("a bin");
    let hll_binl = added(keys(0..100), 8, -1);
    let hll_binu = added(strs((6..11).map(|i| format!("key{i}"))), 10, -1);
    let args = payload(2, vec![blobs(&[&hll_binl]), Value::Int(0)]);
    assert_eq!(
        modify(Some(&hll_bine), &args).expect_err("refused"),
        CdtError::OpNotApplicable
    );

    let folding = payload(2, vec![blobs(&[&hll_binl]), Value::Int(ALLOW_FOLD)]);
    let (folded, _) = modify(Some(&hll_bine), &folding).expect("fold allowed");
    assert_eq!(describe(&folded.expect("a bin")), (8, 0));

    let same_bits = payload(2, vec![blobs(&[&hll_binu]), Value::Int(ALLOW_FOLD)]);
    let (bine, _) = modify(Some(&hll_bine), &same_bits).expect("union");
    let bine = bine.expect("a bin");
    assert_eq!(describe(&bine), (10, 0));
    let n = read(&bine, &payload(53, vec![blobs(&[&hll_binl])])).expect("intersect");
    assert_eq!(as_int(&n), 5);

    // A minhash bin cannot lose its minhash bits without ALLOW_FOLD.
    let mh = added(keys(0..10), 8, 8);
    let plain = added(keys(0..10), 8, 0);
    let args = payload(2, vec![blobs(&[&plain]), Value::Int(0)]);
    assert_eq!(
        modify(Some(&mh), &args).expect_err("refused"),
        CdtError::OpNotApplicable
    );
    let args = payload(2, vec![blobs(&[&plain]), Value::Int(ALLOW_FOLD)]);
    let (merged, _) = modify(Some(&mh), &args).expect("fold");
    assert_eq!(describe(&merged.expect("a bin")), (8, 0));
    // A plain bin takes minhash sketches (their rho parts).
    let args = payload(2, vec![blobs(&[&mh]), Value::Int(0)]);
    let (merged, _) = modify(Some(&plain), &args).expect("union");
    assert_eq!(merged.expect("a bin"), plain);
}

#[test]
fn set_union_creates_the_bin_in_the_arguments_common_shape() {
    let a = added(keys(0..50), 12, 8);
    let b = added(keys(25..75), 10, 8);
    let (bin, _) = modify(None, &payload(2, vec![blobs(&[&a, &b])])).expect("union");
    let bin = bin.expect("a bin");
    assert_eq!(describe(&bin), (10, 8));
    assert!(within(count(&bin), 75, 0.1));
    let c = added(keys(0..5), 12, 4);
    let (bin, _) = modify(None, &payload(2, vec![blobs(&[&a, &c])])).expect("union");
    assert_eq!(describe(&bin.expect("a bin")), (12, 0));
}

// ---- estimates ----

#[test]
fn count_of_ten_thousand_values_is_within_two_percent() {
    let values = strs((0..10_000).map(|i| format!("value-{i}")));
    let (bin, result) = modify(
        None,
        &payload(
            1,
            vec![
                values.clone(),
                Value::Int(14),
                Value::Int(-1),
                Value::Int(0),
            ],
        ),
    )
    .expect("add");
    let bin = bin.expect("a bin");
    let changed = as_int(&result.expect("add answers"));
    assert!(changed > 5000 && changed <= 10_000, "{changed}");
    let estimate = count(&bin);
    assert!(within(estimate, 10_000, 0.02), "{estimate}");

    // The same values again change nothing and are reported so.
    let again = payload(
        1,
        vec![values, Value::Int(14), Value::Int(-1), Value::Int(0)],
    );
    let (after, result) = modify(Some(&bin), &again).expect("add");
    assert_eq!(as_int(&result.expect("add answers")), 0);
    assert_eq!(after.expect("a bin"), bin);

    // Integers hash as their msgpack bytes.
    let ints = list((0..10_000).map(Value::Int).collect());
    let estimate = count(&added(ints, 14, 0));
    assert!(within(estimate, 10_000, 0.02), "{estimate}");
}

#[test]
fn estimates_of_overlapping_sets() {
    // A = 0..6000 and B = 4000..10000: union 10000, intersection 2000,
    // similarity 0.2.
    let a_values = || list((0..6000).map(Value::Int).collect());
    let b_values = || list((4000..10_000).map(Value::Int).collect());
    for (p, q) in [(14, 0), (12, 16)] {
        let a = added(a_values(), p, q);
        let b = added(b_values(), p, q);
        let union = as_int(&read(&a, &payload(52, vec![blobs(&[&b])])).expect("union count"));
        assert!(within(union, 10_000, 0.03), "({p},{q}) union {union}");
        let inter = as_int(&read(&a, &payload(53, vec![blobs(&[&b])])).expect("intersect count"));
        assert!(within(inter, 2000, 0.2), "({p},{q}) intersect {inter}");
        let sim = as_float(&read(&a, &payload(54, vec![blobs(&[&b])])).expect("similarity"));
        assert!((sim - 0.2).abs() < 0.04, "({p},{q}) similarity {sim}");
        // Against itself.
        let sim = as_float(&read(&a, &payload(54, vec![blobs(&[&a])])).expect("similarity"));
        assert!((sim - 1.0).abs() < 0.01, "({p},{q}) self similarity {sim}");
    }
    // Disjoint minhash sets are hardly similar.
    let a = added(list((0..5000).map(Value::Int).collect()), 12, 16);
    let b = added(list((5000..10_000).map(Value::Int).collect()), 12, 16);
    let sim = as_float(&read(&a, &payload(54, vec![blobs(&[&b])])).expect("similarity"));
    assert!(sim < 0.01, "{sim}");
}

#[test]
fn similarity_with_empty_minhash_sketches() {
    let (empty, _) = modify(None, &payload(0, vec![Value::Int(8), Value::Int(8)])).expect("init");
    let empty = empty.expect("a bin");
    let full = added(keys(0..100), 8, 8);
    let sim = as_float(&read(&empty, &payload(54, vec![blobs(&[&empty])])).expect("similarity"));
    assert!(sim.is_nan());
    let sim = as_float(&read(&full, &payload(54, vec![blobs(&[&empty])])).expect("similarity"));
    assert_eq!(sim, 0.0);
    let n = as_int(&read(&empty, &payload(53, vec![blobs(&[&empty])])).expect("intersect"));
    assert_eq!(n, 0);
    assert_eq!(count(&empty), 0);
}

#[test]
fn three_way_intersections() {
    // Without minhash bits, up to three sketches in all (two arguments).
    let a = added(list((0..3000).map(Value::Int).collect()), 14, 0);
    let b = added(list((1000..4000).map(Value::Int).collect()), 14, 0);
    let c = added(list((2000..5000).map(Value::Int).collect()), 14, 0);
    let n = as_int(&read(&a, &payload(53, vec![blobs(&[&b, &c])])).expect("intersect"));
    assert!(within(n, 1000, 0.35), "{n}");
    // Three arguments need a common non-zero minhash bit count ...
    let err = read(&a, &payload(53, vec![blobs(&[&b, &c, &a])])).expect_err("refused");
    assert_eq!(err, CdtError::Parameter);
    let ma = added(list((0..3000).map(Value::Int).collect()), 12, 16);
    let mb = added(list((1000..4000).map(Value::Int).collect()), 12, 16);
    let mc = added(list((2000..5000).map(Value::Int).collect()), 12, 16);
    let md = added(list((2500..3500).map(Value::Int).collect()), 12, 16);
    let n = as_int(&read(&md, &payload(53, vec![blobs(&[&ma, &mb, &mc])])).expect("intersect"));
    assert!(within(n, 500, 0.25), "{n}");
    // ... which the bin must share.
    let err = read(&a, &payload(53, vec![blobs(&[&ma, &mb, &mc])])).expect_err("refused");
    assert_eq!(err, CdtError::OpNotApplicable);
    let err = read(&a, &payload(54, vec![blobs(&[&ma, &mb, &mc])])).expect_err("refused");
    assert_eq!(err, CdtError::OpNotApplicable);
}

// ---- fold ----

#[test]
fn fold_gives_the_sketch_built_with_fewer_index_bits() {
    let big = added(keys(0..1000), 12, 0);
    let small = added(keys(0..1000), 8, 0);
    let (folded, result) = modify(Some(&big), &payload(4, vec![Value::Int(8)])).expect("fold");
    assert!(result.is_none());
    assert_eq!(folded.expect("a bin"), small);
    // To the same size: unchanged.
    let (same, _) = modify(Some(&big), &payload(4, vec![Value::Int(12)])).expect("fold");
    assert_eq!(same.expect("a bin"), big);
    // Up, with minhash bits, unset, or on no bin: refused.
    let up = modify(Some(&big), &payload(4, vec![Value::Int(13)])).expect_err("refused");
    assert_eq!(up, CdtError::OpNotApplicable);
    let mh = added(keys(0..10), 12, 4);
    let err = modify(Some(&mh), &payload(4, vec![Value::Int(4)])).expect_err("refused");
    assert_eq!(err, CdtError::OpNotApplicable);
    let err = modify(Some(&big), &payload(4, vec![Value::Int(-1)])).expect_err("refused");
    assert_eq!(err, CdtError::OpNotApplicable);
    let err = modify(None, &payload(4, vec![Value::Int(8)])).expect_err("refused");
    assert_eq!(err, CdtError::BinNotFound);
    // Out of range: a parameter error.
    let err = modify(Some(&big), &payload(4, vec![Value::Int(2)])).expect_err("refused");
    assert_eq!(err, CdtError::Parameter);
}

// ---- init and add ----

#[test]
fn init_resets_and_keeps_unset_counts() {
    let bin = added(keys(0..100), 10, 6);
    let (reset, _) = modify(Some(&bin), &payload(0, vec![])).expect("init");
    let reset = reset.expect("a bin");
    assert_eq!(describe(&reset), (10, 6));
    assert_eq!(count(&reset), 0);
    let (reset, _) = modify(
        Some(&bin),
        &payload(0, vec![Value::Int(12), Value::Int(-1)]),
    )
    .expect("init");
    assert_eq!(describe(&reset.expect("a bin")), (12, 6));
    // Keeping 51 minhash bits with 16 index bits would pass 64.
    let wide = added(keys(0..3), 9, 51);
    let err = modify(
        Some(&wide),
        &payload(0, vec![Value::Int(16), Value::Int(-1)]),
    )
    .expect_err("refused");
    assert_eq!(err, CdtError::OpNotApplicable);
    // Creating needs the index bits.
    let err = modify(None, &payload(0, vec![Value::Int(-1)])).expect_err("refused");
    assert_eq!(err, CdtError::OpNotApplicable);
    let err = modify(None, &payload(0, vec![])).expect_err("refused");
    assert_eq!(err, CdtError::OpNotApplicable);
}

#[test]
fn add_to_an_existing_bin_keeps_its_shape() {
    let bin = added(keys(0..10), 6, 12);
    let more = payload(
        1,
        vec![keys(10..20), Value::Int(10), Value::Int(0), Value::Int(0)],
    );
    let (after, result) = modify(Some(&bin), &more).expect("add");
    assert!(as_int(&result.expect("a count")) > 0);
    assert_eq!(describe(&after.expect("a bin")), (6, 12));
    // Without bit counts: only onto an existing bin.
    let (after, result) = modify(Some(&bin), &payload(1, vec![keys(0..3)])).expect("add");
    assert_eq!(as_int(&result.expect("a count")), 0);
    assert_eq!(after.expect("a bin"), bin);
    let err = modify(None, &payload(1, vec![keys(0..3)])).expect_err("refused");
    assert_eq!(err, CdtError::OpNotApplicable);
    // Adding clears a cached count.
    let (cached, _) = modify(Some(&bin), &payload(3, vec![])).expect("refresh");
    let cached = cached.expect("a bin");
    assert_ne!(&cached[3..11], &[0; 8]);
    let (after, _) = modify(Some(&cached), &payload(1, vec![keys(100..200)])).expect("add");
    assert_eq!(&after.expect("a bin")[3..11], &[0; 8]);
}

#[test]
fn may_contain_every_added_value() {
    let bin = added(keys(0..200), 12, 0);
    let yes = read(&bin, &payload(56, vec![keys(0..200)])).expect("may contain");
    assert_eq!(as_int(&yes), 1);
    let no = read(&bin, &payload(56, vec![keys(1000..1010)])).expect("may contain");
    assert_eq!(as_int(&no), 0);
}

// ---- flags ----

#[test]
fn create_only_update_only_and_no_fail() {
    let bin = added(keys(0..10), 8, 0);
    let flagged = |flags: u64| {
        payload(
            0,
            vec![Value::Int(8), Value::Int(0), Value::Int(flags as i64)],
        )
    };
    assert_eq!(
        modify(Some(&bin), &flagged(CREATE_ONLY)).expect_err("refused"),
        CdtError::BinExists
    );
    let (after, result) = modify(Some(&bin), &flagged(CREATE_ONLY | NO_FAIL)).expect("no fail");
    assert!(after.is_none() && result.is_none());
    assert_eq!(
        modify(None, &flagged(UPDATE_ONLY)).expect_err("refused"),
        CdtError::BinNotFound
    );
    let (after, result) = modify(None, &flagged(UPDATE_ONLY | NO_FAIL)).expect("no fail");
    assert!(after.is_none() && result.is_none());
    let (after, _) = modify(Some(&bin), &flagged(UPDATE_ONLY)).expect("update");
    assert_eq!(count(&after.expect("a bin")), 0);
    let (after, _) = modify(None, &flagged(CREATE_ONLY)).expect("create");
    assert!(after.is_some());
    // Both at once, or flags the op does not take: parameter errors.
    let err = modify(None, &flagged(CREATE_ONLY | UPDATE_ONLY)).expect_err("refused");
    assert_eq!(err, CdtError::Parameter);
    let err = modify(None, &flagged(super::ALLOW_FOLD)).expect_err("refused");
    assert_eq!(err, CdtError::Parameter);
    let err = modify(None, &flagged(0x10)).expect_err("refused");
    assert_eq!(err, CdtError::Parameter);
    let add = |flags: u64| {
        payload(
            1,
            vec![
                keys(0..3),
                Value::Int(8),
                Value::Int(-1),
                Value::Int(flags as i64),
            ],
        )
    };
    assert_eq!(
        modify(None, &add(UPDATE_ONLY)).expect_err("refused"),
        CdtError::Parameter
    );
    assert_eq!(
        modify(Some(&bin), &add(CREATE_ONLY)).expect_err("refused"),
        CdtError::BinExists
    );
    // NO_FAIL does not cover the shape checks.
    let create = payload(
        1,
        vec![
            keys(0..3),
            Value::Int(-1),
            Value::Int(-1),
            Value::Int(NO_FAIL as i64),
        ],
    );
    assert_eq!(
        modify(None, &create).expect_err("refused"),
        CdtError::OpNotApplicable
    );
    let err = modify(None, &payload(3, vec![])).expect_err("refused");
    assert_eq!(err, CdtError::BinNotFound);
}

// ---- malformed ops ----

#[test]
fn bit_counts_out_of_range_are_parameter_errors() {
    for (p, q) in [
        (3, 0),
        (17, 0),
        (0, 0),
        (20, 8),
        (4, 3),
        (4, 52),
        (4, 59),
        (17, 48),
        (14, 51),
        (16, 49),
    ] {
        let init = payload(0, vec![Value::Int(p), Value::Int(q), Value::Int(0)]);
        assert_eq!(
            modify(None, &init).expect_err("refused"),
            CdtError::Parameter,
            "({p}, {q})"
        );
    }
    for (p, q) in [(4, 4), (4, 51), (9, 51), (16, 48), (13, 51)] {
        let init = payload(0, vec![Value::Int(p), Value::Int(q), Value::Int(0)]);
        assert!(modify(None, &init).is_ok(), "({p}, {q})");
    }
}

#[test]
fn malformed_payloads_are_parameter_errors() {
    let bin = added(keys(0..10), 8, 0);
    let cases: Vec<(Vec<u8>, bool)> = vec![
        (vec![], true),
        (vec![0x90], true),
        (value::to_bytes(&Value::Int(50)), false),
        (payload(5, vec![]), true),
        (payload(49, vec![]), false),
        (payload(57, vec![]), false),
        (payload(-1, vec![]), true),
        // Reads under the modify op type and the reverse.
        (payload(50, vec![]), true),
        (payload(3, vec![]), false),
        // Too many or too few arguments.
        (payload(50, vec![Value::Int(1)]), false),
        (payload(4, vec![]), true),
        (payload(3, vec![Value::Int(0)]), true),
        // Empty or nested value lists, values of the wrong kind.
        (payload(1, vec![list(vec![])]), true),
        (payload(1, vec![list(vec![list(vec![])])]), true),
        (payload(1, vec![Value::Int(3)]), true),
        (payload(0, vec![Value::Str(b"8".to_vec())]), true),
        // Sketch arguments: empty, not bytes, wrong size, flagged.
        (payload(51, vec![list(vec![])]), false),
        (payload(51, vec![list(vec![Value::Int(1)])]), false),
        (payload(51, vec![blobs(&[&bin[..bin.len() - 1]])]), false),
        (payload(51, vec![blobs(&[&[0u8; 5]])]), false),
    ];
    for (bytes, modify_op) in cases {
        let err = operate(&bytes, Some((HLL, &bin)), modify_op).expect_err("refused");
        assert_eq!(err, CdtError::Parameter, "{bytes:02x?} modify {modify_op}");
    }
    let mut flagged = bin.clone();
    flagged[0] = 1;
    let err = read(&bin, &payload(51, vec![blobs(&[&flagged])])).expect_err("refused");
    assert_eq!(err, CdtError::Parameter);
    // Truncated anywhere: never a panic.
    let full = payload(
        1,
        vec![keys(0..5), Value::Int(8), Value::Int(4), Value::Int(0)],
    );
    for end in 0..full.len() {
        assert!(operate(&full[..end], None, true).is_err(), "{end}");
    }
}

#[test]
fn wrong_bin_types_and_missing_bins() {
    let ops = [payload(50, vec![]), payload(55, vec![])];
    for op in &ops {
        let err =
            operate(op, Some((ParticleType::Blob as u8, b"abc")), false).expect_err("refused");
        assert_eq!(err, CdtError::IncompatibleType);
        // A missing bin reads as nothing.
        let outcome = operate(op, None, false).expect("read of no bin");
        assert!(outcome.bin.is_none() && outcome.result.is_none());
    }
    let add = payload(1, vec![keys(0..3), Value::Int(8)]);
    let err =
        operate(&add, Some((ParticleType::Integer as u8, &[0; 8])), true).expect_err("refused");
    assert_eq!(err, CdtError::IncompatibleType);
    // A corrupt stored sketch is refused, not read.
    let err = operate(&ops[0], Some((HLL, &[0, 8, 0])), false).expect_err("refused");
    assert_eq!(err, CdtError::Parameter);
}

#[test]
fn a_single_hll_argument_counts_as_a_list_of_one() {
    // What an expression packs for `HLLGetUnion(HLLBin("a"), HLLBin("b"))`:
    // the argument is one HLL, not a list of them.
    let a = added(keys(0..3), 8, -1);
    let b = added(keys(2..6), 8, -1);
    let single = payload(51, vec![Value::Blob(HLL, b.clone())]);
    let listed = payload(51, vec![blobs(&[&b])]);
    assert_eq!(
        read(&a, &single).expect("union of one"),
        read(&a, &listed).expect("union of a list")
    );
    let n = read(&a, &payload(52, vec![Value::Blob(HLL, b)])).expect("union count");
    assert_eq!(as_int(&n), 6);
}
