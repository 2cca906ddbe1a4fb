//! MurmurHash3, the x64 128-bit variant (Austin Appleby's public-domain
//! design): the hash the reference server applies to every value added to
//! an HLL bin, always with seed 0.
//!
//! Owns nothing but the function. Invariants: input blocks are read
//! little-endian whatever the host (the reference runs on little-endian
//! machines, so this matches its output everywhere); the two output words
//! are returned as `(h1, h2)`, the first and second 8 bytes of the
//! reference's 16-byte digest read little-endian.

const C1: u64 = 0x87c3_7b91_1142_53d5;
const C2: u64 = 0x4cf5_ad43_2745_937f;

/// Final avalanche of one 64-bit lane.
fn fmix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// Mixes the first lane's key word.
fn mix_k1(k: u64) -> u64 {
    k.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2)
}

/// Mixes the second lane's key word.
fn mix_k2(k: u64) -> u64 {
    k.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1)
}

/// Little-endian word of up to 8 bytes (missing high bytes are zero).
fn le_word(bytes: &[u8]) -> u64 {
    debug_assert!(bytes.len() <= 8);
    bytes
        .iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

/// The 128-bit hash of `data` with `seed`, as `(h1, h2)`.
pub(crate) fn hash128(data: &[u8], seed: u32) -> (u64, u64) {
    let mut h1 = u64::from(seed);
    let mut h2 = u64::from(seed);

    let mut blocks = data.chunks_exact(16);
    for block in &mut blocks {
        let (lo, hi) = block.split_at(8);
        h1 ^= mix_k1(le_word(lo));
        h1 = h1
            .rotate_left(27)
            .wrapping_add(h2)
            .wrapping_mul(5)
            .wrapping_add(0x52dc_e729);
        h2 ^= mix_k2(le_word(hi));
        h2 = h2
            .rotate_left(31)
            .wrapping_add(h1)
            .wrapping_mul(5)
            .wrapping_add(0x3849_5ab5);
    }

    let tail = blocks.remainder();
    if tail.len() > 8 {
        h2 ^= mix_k2(le_word(&tail[8..]));
    }
    if !tail.is_empty() {
        h1 ^= mix_k1(le_word(&tail[..tail.len().min(8)]));
    }

    let len = data.len() as u64;
    h1 ^= len;
    h2 ^= len;
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    h1 = fmix(h1);
    h2 = fmix(h2);
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    (h1, h2)
}

#[cfg(test)]
mod tests {
    use super::hash128;

    /// The digest bytes as the reference lays them out (h1 then h2, each
    /// little-endian).
    fn digest(data: &[u8], seed: u32) -> [u8; 16] {
        let (h1, h2) = hash128(data, seed);
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&h1.to_le_bytes());
        out[8..].copy_from_slice(&h2.to_le_bytes());
        out
    }

    #[test]
    fn empty_input_with_seed_zero_hashes_to_zero() {
        assert_eq!(hash128(b"", 0), (0, 0));
    }

    /// SMHasher's verification value for MurmurHash3_x64_128: hash the keys
    /// `[]`, `[0]`, `[0, 1]`, ... `[0..=254]` with seeds 256, 255, ... 2,
    /// hash the concatenated digests with seed 0, and read the first four
    /// bytes little-endian. Covers every tail length and several blocks.
    #[test]
    fn smhasher_verification_value() {
        let mut all = Vec::with_capacity(256 * 16);
        let mut key = Vec::with_capacity(256);
        for i in 0..256u32 {
            all.extend_from_slice(&digest(&key, 256 - i));
            key.push(i as u8);
        }
        let last = digest(&all, 0);
        let verification = u32::from_le_bytes([last[0], last[1], last[2], last[3]]);
        assert_eq!(verification, 0x6384_BA69);
    }

    #[test]
    fn seed_and_every_byte_matter() {
        let base = hash128(b"The quick brown fox jumps", 0);
        assert_ne!(base, hash128(b"The quick brown fox jumps", 1));
        assert_ne!(base, hash128(b"The quick brown fox jumpt", 0));
        assert_ne!(base, hash128(b"the quick brown fox jumps", 0));
    }
}
