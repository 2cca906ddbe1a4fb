//! Key-choice distributions of the benchmark: uniform and Zipfian.
//!
//! Owns a small fast PRNG ([`SplitMix64`]) and the Zipfian generator of
//! Gray et al. ("Quickly generating billion-record synthetic databases",
//! SIGMOD 1994), the one YCSB uses: rank 0 is the most popular, and
//! P(rank i) ∝ 1 / (i+1)^theta. Invariant: every sample is `< n`.

/// SplitMix64: a 64-bit PRNG, good enough for load generation (not crypto).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n) (n > 0), by multiply-shift (negligible bias for n ≪ 2^64).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// A key distribution over [0, n).
#[derive(Clone, Debug)]
pub enum KeyDistribution {
    Uniform { n: u64 },
    Zipf(Zipf),
}

impl KeyDistribution {
    /// Name for reports.
    pub fn label(&self) -> String {
        match self {
            KeyDistribution::Uniform { .. } => "uniform".into(),
            KeyDistribution::Zipf(zipf) => format!("zipf({})", zipf.theta()),
        }
    }

    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        match self {
            KeyDistribution::Uniform { n } => rng.below(*n),
            KeyDistribution::Zipf(zipf) => zipf.sample(rng),
        }
    }
}

/// Zipfian ranks over [0, n) with exponent `theta` in (0, 1).
#[derive(Clone, Debug)]
pub struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    half_pow_theta: f64,
}

/// ζ(n, θ) = Σ_{i=1..n} 1 / i^θ.
pub fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

impl Zipf {
    /// Builds the generator; O(n) once (ζ sum). `theta` must be in (0, 1).
    pub fn new(n: u64, theta: f64) -> Result<Zipf, String> {
        if n == 0 {
            return Err("zipf needs at least one key".into());
        }
        if !(theta > 0.0 && theta < 1.0) {
            return Err(format!(
                "--zipf THETA must be strictly between 0 and 1 (YCSB uses 0.99), got {theta}"
            ));
        }
        let zetan = zeta(n, theta);
        let zeta2 = zeta(2.min(n), theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = if n > 1 {
            (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan)
        } else {
            0.0
        };
        Ok(Zipf {
            n,
            theta,
            alpha,
            zetan,
            eta,
            half_pow_theta: 0.5f64.powf(theta),
        })
    }

    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// Probability of rank `i`.
    #[cfg(test)]
    pub fn probability(&self, rank: u64) -> f64 {
        1.0 / ((rank + 1) as f64).powf(self.theta) / self.zetan
    }

    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + self.half_pow_theta {
            return 1.min(self.n - 1);
        }
        let rank = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        rank.min(self.n - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_stays_in_range_and_spreads() {
        let mut rng = SplitMix64::new(1);
        let dist = KeyDistribution::Uniform { n: 10 };
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[dist.sample(&mut rng) as usize] += 1;
        }
        for count in counts {
            assert!((9_000..11_000).contains(&count), "{counts:?}");
        }
        for _ in 0..1000 {
            assert!(rng.next_f64() < 1.0);
        }
    }

    #[test]
    fn zipf_matches_its_distribution() {
        let n = 1000;
        let zipf = Zipf::new(n, 0.99).expect("valid");
        let mut rng = SplitMix64::new(42);
        let samples = 400_000;
        let mut counts = vec![0u64; n as usize];
        for _ in 0..samples {
            let rank = zipf.sample(&mut rng);
            assert!(rank < n);
            counts[rank as usize] += 1;
        }
        // Head ranks are produced exactly by the algorithm: compare with the formula.
        for rank in 0..2u64 {
            let expected = zipf.probability(rank) * samples as f64;
            let got = counts[rank as usize] as f64;
            assert!(
                (got - expected).abs() / expected < 0.05,
                "rank {rank}: {got} vs {expected}"
            );
        }
        // The tail is approximated: check monotone-ish decay and heavy head.
        let head: u64 = counts[..10].iter().sum();
        let tail: u64 = counts[990..].iter().sum();
        assert!(head > 20 * tail.max(1), "head {head} tail {tail}");
        assert!(counts[0] > counts[10] && counts[10] > counts[500]);
    }

    #[test]
    fn zipf_rejects_bad_theta() {
        assert!(Zipf::new(10, 0.0).is_err());
        assert!(Zipf::new(10, 1.0).is_err());
        assert!(Zipf::new(0, 0.5).is_err());
        let one = Zipf::new(1, 0.5).expect("one key");
        let mut rng = SplitMix64::new(3);
        assert!((0..100).all(|_| one.sample(&mut rng) == 0));
    }

    #[test]
    fn zeta_small_values() {
        assert!((zeta(1, 0.5) - 1.0).abs() < 1e-12);
        assert!((zeta(2, 1.0) - 1.5).abs() < 1e-12);
    }
}
