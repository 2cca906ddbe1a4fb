//! One HyperMinHash sketch (an HLL whose registers may carry minhash bits,
//! arXiv 1710.08436) in the reference server's particle layout, and the
//! estimators over one or several sketches.
//!
//! Particle layout (the bytes of an HLL bin, particle type 18, and of the
//! HLL blobs clients pass to unions): flags (1 byte, always 0), index bit
//! count `p` (1), minhash bit count `q` (1), a cached count (8 bytes,
//! little-endian; 0 = none), then `2^p` registers of `6 + q` bits each,
//! packed back to back most significant bit first, padded with zero bits
//! to a whole byte. A register holds `(rho << q) | minhash`, where `rho`
//! (6 bits) is one plus the number of trailing zeros of the value hash's
//! second word and `minhash` the `q` bits of its first word above the
//! index bits; the register number is the first word's low `p` bits.
//!
//! Invariants: `registers.len() == registers_len(p, q)`; `p` is in
//! 4..=16 and `q` is 0 or 4..=51 (a stored sketch also has `p + q <= 64`;
//! a sketch a client passes to a union may not, as in the reference);
//! every read or write of a register stays inside `registers`; nothing
//! here panics on any input.

use super::murmur3;

/// Bits of the HLL (rho) part of a register.
pub(crate) const HLL_BITS: u32 = 6;
/// Bytes before the registers: flags, p, q, cached count.
pub(crate) const HEADER_LEN: usize = 11;
pub(crate) const MIN_INDEX_BITS: u8 = 4;
pub(crate) const MAX_INDEX_BITS: u8 = 16;
pub(crate) const MIN_MINHASH_BITS: u8 = 4;
/// 64 - 6 - 7: a register must fit a 64-bit window at any bit offset.
pub(crate) const MAX_MINHASH_BITS: u8 = 51;
/// Bound on `p + q` for a sketch the server builds.
pub(crate) const MAX_COMBINED_BITS: u32 = 64;
/// Counts of rho values 0..=64 (the estimator's `q + 1` buckets).
const RHO_BUCKETS: usize = 1 << HLL_BITS;

/// Whether `p` is an index bit count the reference accepts.
pub(crate) fn valid_index_bits(p: u64) -> bool {
    (u64::from(MIN_INDEX_BITS)..=u64::from(MAX_INDEX_BITS)).contains(&p)
}

/// Whether `q` is a minhash bit count the reference accepts.
pub(crate) fn valid_minhash_bits(q: u64) -> bool {
    q == 0 || (u64::from(MIN_MINHASH_BITS)..=u64::from(MAX_MINHASH_BITS)).contains(&q)
}

/// Whether `(p, q)` may describe a sketch the server builds or stores.
pub(crate) fn valid_combined_bits(p: u64, q: u64) -> bool {
    valid_index_bits(p) && valid_minhash_bits(q) && p + q <= u64::from(MAX_COMBINED_BITS)
}

/// Bytes of the registers of a `(p, q)` sketch.
pub(crate) fn registers_len(p: u8, q: u8) -> usize {
    let bits = (HLL_BITS as usize + usize::from(q)) << p;
    bits.div_ceil(8)
}

/// Bytes of a whole `(p, q)` particle.
pub(crate) fn particle_len(p: u8, q: u8) -> usize {
    HEADER_LEN + registers_len(p, q)
}

/// The sketch's shape: index and minhash bit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub p: u8,
    pub q: u8,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sketch {
    p: u8,
    q: u8,
    /// The count a refresh stored; 0 when unknown. Estimates return it as
    /// is when set, and any register change clears it.
    cache: u64,
    registers: Vec<u8>,
}

/// How strictly [`Sketch::parse`] checks the shape.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// A stored bin: `p + q <= 64` too.
    Stored,
    /// A sketch argument of an op: `p` and `q` each in range.
    Argument,
}

impl Sketch {
    /// An empty sketch (all registers zero, no cached count).
    pub(crate) fn new(shape: Shape) -> Sketch {
        debug_assert!(valid_index_bits(u64::from(shape.p)));
        debug_assert!(valid_minhash_bits(u64::from(shape.q)));
        Sketch {
            p: shape.p,
            q: shape.q,
            cache: 0,
            registers: vec![0; registers_len(shape.p, shape.q)],
        }
    }

    /// Reads a particle; `None` when the flags are not 0, the bit counts
    /// are out of range or the length does not match them.
    pub(crate) fn parse(bytes: &[u8], check: Check) -> Option<Sketch> {
        let header = bytes.get(..HEADER_LEN)?;
        let (flags, p, q) = (header[0], header[1], header[2]);
        if flags != 0 {
            return None;
        }
        let shape_ok = match check {
            Check::Stored => valid_combined_bits(u64::from(p), u64::from(q)),
            Check::Argument => valid_index_bits(u64::from(p)) && valid_minhash_bits(u64::from(q)),
        };
        if !shape_ok || bytes.len() != particle_len(p, q) {
            return None;
        }
        let mut cache = [0u8; 8];
        cache.copy_from_slice(&header[3..HEADER_LEN]);
        Some(Sketch {
            p,
            q,
            cache: u64::from_le_bytes(cache),
            registers: bytes[HEADER_LEN..].to_vec(),
        })
    }

    /// The particle bytes.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.registers.len());
        out.extend_from_slice(&[0, self.p, self.q]);
        out.extend_from_slice(&self.cache.to_le_bytes());
        out.extend_from_slice(&self.registers);
        debug_assert_eq!(out.len(), particle_len(self.p, self.q));
        out
    }

    pub(crate) fn shape(&self) -> Shape {
        Shape {
            p: self.p,
            q: self.q,
        }
    }

    fn n_registers(&self) -> u32 {
        1u32 << self.p
    }

    fn register_bits(&self) -> u32 {
        HLL_BITS + u32::from(self.q)
    }

    /// Byte range and the number of low bits to drop, for register `r`:
    /// the register's bits end `shift` bits before the end of the range.
    fn locate(&self, r: u32) -> (usize, usize, u32) {
        let width = self.register_bits() as usize;
        let start_bit = r as usize * width;
        let end_bit = start_bit + width;
        let first = start_bit / 8;
        let last = end_bit.div_ceil(8);
        let shift = (last * 8 - end_bit) as u32;
        (first, last, shift)
    }

    /// Register `r` (0 outside the sketch, which callers never ask for).
    pub(crate) fn get(&self, r: u32) -> u64 {
        debug_assert!(r < self.n_registers());
        let (first, last, shift) = self.locate(r);
        let Some(bytes) = self.registers.get(first..last) else {
            return 0;
        };
        // At most 9 bytes: 57 bits at a bit offset of up to 7.
        let window = bytes
            .iter()
            .fold(0u128, |acc, &b| (acc << 8) | u128::from(b));
        let mask = (1u128 << self.register_bits()) - 1;
        ((window >> shift) & mask) as u64
    }

    /// Sets register `r` to the low register-width bits of `value`.
    pub(crate) fn set(&mut self, r: u32, value: u64) {
        debug_assert!(r < self.n_registers());
        let (first, last, shift) = self.locate(r);
        let mask = ((1u128 << self.register_bits()) - 1) << shift;
        let Some(bytes) = self.registers.get_mut(first..last) else {
            return;
        };
        let window = bytes
            .iter()
            .fold(0u128, |acc, &b| (acc << 8) | u128::from(b));
        let window = (window & !mask) | ((u128::from(value) << shift) & mask);
        let n = bytes.len();
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = (window >> (8 * (n - 1 - i))) as u8;
        }
    }

    /// The rho part of a register value.
    fn rho(&self, value: u64) -> u8 {
        (value >> self.q) as u8
    }

    /// Where a value lands and what it would store there.
    pub(crate) fn hash(&self, element: &[u8]) -> (u32, u64) {
        let (h1, h2) = murmur3::hash128(element, 0);
        let index = (h1 & u64::from(self.n_registers() - 1)) as u32;
        let minhash_mask = (1u64 << self.q) - 1;
        let minhash = (h1 >> self.p) & minhash_mask;
        // Trailing zeros of a zero word count as 64, so rho is 1..=65;
        // values past 63 lose their high bits when stored, as in the
        // reference (probability 2^-63).
        let rho = u64::from(h2.trailing_zeros() + 1);
        (index, (rho << self.q) | minhash)
    }

    /// Adds one element (its msgpack bytes); whether a register changed.
    pub(crate) fn add(&mut self, element: &[u8]) -> bool {
        let (index, value) = self.hash(element);
        if self.get(index) < value {
            self.set(index, value);
            self.cache = 0;
            true
        } else {
            false
        }
    }

    /// Whether adding the element would change nothing.
    pub(crate) fn may_contain(&self, element: &[u8]) -> bool {
        let (index, value) = self.hash(element);
        self.get(index) >= value
    }

    /// Stores the current estimate as the cached count; returns it.
    pub(crate) fn refresh(&mut self) -> u64 {
        self.cache = self.estimate();
        self.cache
    }

    /// Estimated count of distinct elements: the cached count when set,
    /// else Ertl's improved estimator (arXiv 1702.01284, algorithm 6) over
    /// the rho values, scaled by the classic alpha as the reference does.
    pub(crate) fn estimate(&self) -> u64 {
        if self.cache != 0 {
            return self.cache;
        }
        let m = self.n_registers();
        let mut counts = [0u32; RHO_BUCKETS + 1];
        for r in 0..m {
            let rho = usize::from(self.rho(self.get(r)));
            if let Some(count) = counts.get_mut(rho) {
                *count += 1;
            }
        }
        let mf = f64::from(m);
        let mut z = mf * tau(f64::from(counts[RHO_BUCKETS]) / mf);
        for k in (1..=RHO_BUCKETS).rev() {
            z = 0.5 * (z + f64::from(counts[k]));
        }
        z += mf * sigma(f64::from(counts[0]) / mf);
        // `as` saturates: an empty sketch gives z = inf and so 0.
        (alpha(self.p) * mf * mf / z).round() as u64
    }

    /// Takes each register of `other` into this one (keeping the larger),
    /// folding `other`'s registers onto this one's fewer when `other` has
    /// more index bits. Without minhash bits here, only rho values count.
    pub(crate) fn union_with(&mut self, other: &Sketch) {
        debug_assert!(self.p <= other.p);
        let mask = self.n_registers() - 1;
        for r in 0..other.n_registers() {
            let target = r & mask;
            if self.q == 0 {
                let mine = self.rho(self.get(target));
                let theirs = other.rho(other.get(r));
                if mine < theirs {
                    self.set(target, u64::from(theirs));
                }
            } else {
                let mine = self.get(target);
                let theirs = other.get(r);
                if mine < theirs {
                    self.set(target, theirs);
                }
            }
        }
        self.cache = 0;
    }

    /// Keeps only the registers equal in `other` (the others become 0).
    fn intersect_with(&mut self, other: &Sketch) {
        debug_assert!(self.p <= other.p);
        let mask = self.n_registers() - 1;
        for r in 0..other.n_registers() {
            let target = r & mask;
            let mine = self.get(target);
            let keep = if mine == other.get(r) { mine } else { 0 };
            self.set(target, keep);
        }
        self.cache = 0;
    }

    fn used_registers(&self) -> u32 {
        (0..self.n_registers())
            .filter(|&r| self.get(r) != 0)
            .count() as u32
    }

    /// Whether the sketch holds anything, judged as the reference does: by
    /// its first `2^p` register bytes only (which, with minhash bits, do
    /// not cover every register).
    fn has_data(&self) -> bool {
        let judged = (self.n_registers() as usize / 8) * 8;
        self.registers.iter().take(judged).any(|&byte| byte != 0)
    }
}

/// Ertl's tau function.
fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let mut y = 1.0;
    let mut z = 1.0 - x;
    // Converges in a few dozen rounds; the bound only guards the loop.
    for _ in 0..4096 {
        x = x.sqrt();
        let previous = z;
        y *= 0.5;
        z -= (1.0 - x).powi(2) * y;
        if previous == z {
            break;
        }
    }
    z / 3.0
}

/// Ertl's sigma function.
fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let mut y = 1.0;
    let mut z = x;
    for _ in 0..4096 {
        x *= x;
        let previous = z;
        z += x * y;
        y += y;
        if previous == z {
            break;
        }
    }
    z
}

/// The classic HLL bias constant for `2^p` registers.
fn alpha(p: u8) -> f64 {
    match p {
        4 => 0.673,
        5 => 0.697,
        6 => 0.709,
        _ => 0.7213 / (1.0 + 1.079 / f64::from(1u32 << p)),
    }
}

/// The shape every sketch of `sketches` can fold into: the fewest index
/// bits, and the common minhash bit count (0 when they differ).
pub(crate) fn common_shape(sketches: &[&Sketch]) -> Option<Shape> {
    let (first, rest) = sketches.split_first()?;
    let mut shape = first.shape();
    for sketch in rest {
        shape.p = shape.p.min(sketch.p);
        if shape.q != sketch.q {
            shape.q = 0;
        }
    }
    Some(shape)
}

/// The union of all, in their common shape.
pub(crate) fn union_all(sketches: &[&Sketch]) -> Option<Sketch> {
    let mut union = Sketch::new(common_shape(sketches)?);
    for sketch in sketches {
        union.union_with(sketch);
    }
    Some(union)
}

/// Estimated count of the union.
pub(crate) fn union_count(sketches: &[&Sketch]) -> u64 {
    union_all(sketches).map_or(0, |union| union.estimate())
}

/// Estimated count of the intersection: inclusion-exclusion over plain
/// HLL estimates when the sketches share no minhash bits (2 or 3 of
/// them), else the union count times the estimated Jaccard similarity.
pub(crate) fn intersect_count(sketches: &[&Sketch]) -> u64 {
    let Some(shape) = common_shape(sketches) else {
        return 0;
    };
    if shape.q == 0 {
        return hll_intersect_count(sketches);
    }
    let similarity = hmh_similarity(shape, sketches);
    if similarity.is_nan() {
        return 0;
    }
    (union_count(sketches) as f64 * similarity).round() as u64
}

/// Inclusion-exclusion on estimates, clamped at 0 (callers pass 2 or 3
/// sketches; the reference treats any other number as 3).
fn hll_intersect_count(sketches: &[&Sketch]) -> u64 {
    let union = union_count(sketches);
    let mut sum: u64 = 0;
    for sketch in sketches {
        match sum.checked_add(sketch.estimate()) {
            Some(total) => sum = total,
            None => {
                sum = u64::MAX;
                break;
            }
        }
    }
    if sketches.len() <= 2 {
        return sum.saturating_sub(union);
    }
    let (Some(a), Some(b), Some(c)) = (sketches.first(), sketches.get(1), sketches.get(2)) else {
        return 0;
    };
    let pairs = intersect_count(&[a, b])
        .wrapping_add(intersect_count(&[b, c]))
        .wrapping_add(intersect_count(&[a, c]));
    // The reference computes this in signed 64-bit arithmetic.
    let result = (union as i64).wrapping_sub((sum as i64).wrapping_sub(pairs as i64));
    u64::try_from(result).unwrap_or(0)
}

/// Estimated Jaccard similarity (|intersection| / |union|).
pub(crate) fn similarity(sketches: &[&Sketch]) -> f64 {
    let Some(shape) = common_shape(sketches) else {
        return f64::NAN;
    };
    if shape.q == 0 {
        let intersection = hll_intersect_count(sketches);
        let union = union_count(sketches);
        return intersection as f64 / union as f64;
    }
    hmh_similarity(shape, sketches)
}

/// HyperMinHash similarity: registers equal in all over registers used by
/// any, less the expected chance collisions when there are two.
fn hmh_similarity(shape: Shape, sketches: &[&Sketch]) -> f64 {
    debug_assert!(shape.q != 0);
    let with_data = sketches.iter().filter(|s| s.has_data()).count();
    if with_data < sketches.len() {
        return if with_data > 0 { 0.0 } else { f64::NAN };
    }
    let mut union = Sketch::new(shape);
    for sketch in sketches {
        union.union_with(sketch);
    }
    let n_union = union.used_registers();

    let mut intersection = Sketch::new(shape);
    let Some((first, rest)) = sketches.split_first() else {
        return f64::NAN;
    };
    intersection.union_with(first);
    for sketch in rest {
        intersection.intersect_with(sketch);
    }
    let n_intersection = intersection.used_registers();

    let collisions = match sketches {
        [a, b] => expected_collisions(shape, a.estimate(), b.estimate()),
        _ => 0.0,
    };
    let result = (f64::from(n_intersection) - collisions) / f64::from(n_union);
    if result < 0.0 {
        0.0
    } else {
        result
    }
}

/// Expected number of registers two unrelated sets of the given counts
/// would match by chance (HyperMinHash, arXiv 1710.08436).
fn expected_collisions(shape: Shape, count0: u64, count1: u64) -> f64 {
    let m = f64::from(1u32 << shape.p);
    let buckets = 1i32 << HLL_BITS;
    let mut chance = 0.0;
    for i in 1..=buckets {
        let (low, high) = if i == buckets {
            (0.0, 2f64.powi(1 - i))
        } else {
            (2f64.powi(-i), 2f64.powi(1 - i))
        };
        let low = low / m;
        let high = high / m;
        let px = (1.0 - low).powf(count0 as f64) - (1.0 - high).powf(count0 as f64);
        let py = (1.0 - low).powf(count1 as f64) - (1.0 - high).powf(count1 as f64);
        chance += px * py;
    }
    chance * m / 2f64.powi(i32::from(shape.q))
}
