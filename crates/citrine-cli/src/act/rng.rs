//! A small, fast pseudo-random generator (SplitMix64) for addresses and
//! block contents: each I/O thread owns one, seeded from the run's seed and
//! the thread's index, so a run's address sequence is reproducible from
//! `--seed`.
//!
//! Invariant: `below(n)` is in `0..n` for every `n ≥ 1`. The generator
//! is the benchmark's SplitMix64 ([`crate::bench::zipf::SplitMix64`]).

use crate::bench::zipf::SplitMix64;

pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `0..n` (`n ≥ 1`; 0 for `n` = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.below(n.max(1))
    }

    /// Fills `bytes` with random bytes.
    pub fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_spreads() {
        let mut rng = Rng::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[rng.below(10) as usize] += 1;
        }
        assert!(
            seen.iter().all(|count| (800..1200).contains(count)),
            "{seen:?}"
        );
        assert_eq!(rng.below(1), 0);
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        assert_eq!(a.next_u64(), b.next_u64());
    }
}
