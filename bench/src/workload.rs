//! Key sequences, generated before any timed loop: uniform, Zipf and one hot key.

/// A small fast generator (SplitMix64) so that sequences are reproducible from a seed.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The key distributions of the throughput benchmarks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Distribution {
    /// Every key of `0..keys` equally likely.
    Uniform,
    /// Key of rank r (0-based) with probability proportional to 1 / (r + 1)^s; ranks are
    /// scattered over the key space so that hot keys do not share cache lines.
    Zipf(f64),
    /// Always key 0.
    HotKey,
}

impl Distribution {
    /// Short name for bench ids.
    pub fn name(self) -> String {
        match self {
            Distribution::Uniform => "uniform".into(),
            Distribution::Zipf(s) => format!("zipf{s}"),
            Distribution::HotKey => "hot_key".into(),
        }
    }
}

/// `len` keys from `0..keys` drawn from `dist`.
pub fn keys(dist: Distribution, keys: u64, len: usize, seed: u64) -> Vec<u64> {
    let mut rng = SplitMix::new(seed);
    match dist {
        Distribution::Uniform => (0..len).map(|_| rng.next_u64() % keys).collect(),
        Distribution::HotKey => vec![0; len],
        Distribution::Zipf(s) => {
            let cdf = zipf_cdf(keys, s);
            // A fixed odd multiplier is a bijection on 0..2^64; reduced mod `keys` it spreads
            // neighbouring ranks over the key space.
            (0..len)
                .map(|_| {
                    let u = rng.next_f64();
                    let rank = cdf.partition_point(|&c| c < u) as u64;
                    rank.min(keys - 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) % keys
                })
                .collect()
        }
    }
}

/// Cumulative probabilities of Zipf(`s`) over `n` ranks.
fn zipf_cdf(n: u64, s: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=n).map(|r| (r as f64).powf(-s)).collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    weights
        .iter()
        .map(|w| {
            acc += w / total;
            acc
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_favours_low_ranks_and_stays_in_range() {
        let ks = keys(Distribution::Zipf(1.0), 1000, 100_000, 7);
        assert!(ks.iter().all(|&k| k < 1000));
        let hottest = 0u64; // rank 0 maps to key 0
        let hot = ks.iter().filter(|&&k| k == hottest).count();
        // Zipf(1) over 1000 ranks gives rank 0 about 13% of draws.
        assert!(hot > 10_000 && hot < 16_000, "{hot}");
    }

    #[test]
    fn uniform_covers_the_key_space() {
        let ks = keys(Distribution::Uniform, 100, 10_000, 1);
        let mut seen = [false; 100];
        ks.iter().for_each(|&k| seen[k as usize] = true);
        assert!(seen.iter().all(|&s| s));
    }
}
