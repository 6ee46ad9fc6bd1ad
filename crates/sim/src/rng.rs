//! Seeded random streams. One `u64` seed drives a whole run; each consumer
//! (the workload generator, each server's faults and durations, the
//! sampler) gets its own stream derived from the seed and a stable label,
//! so that adding draws in one place never shifts the draws of another.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub type SimRng = ChaCha8Rng;

/// SplitMix64 finaliser: spreads nearby seeds and labels apart.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stream for `label` and `index` under `seed`.
pub fn stream(seed: u64, label: &str, index: u64) -> SimRng {
    let mut h = mix(seed);
    for b in label.bytes() {
        h = mix(h ^ u64::from(b));
    }
    h = mix(h ^ index);
    ChaCha8Rng::seed_from_u64(h)
}

/// A standard normal draw (Box-Muller; one of the pair is discarded so
/// that every call consumes exactly two uniforms).
pub fn standard_normal(rng: &mut SimRng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// z-score of the 90th percentile of the standard normal.
const Z90: f64 = 1.281_551_565_545;

/// A log-normal duration with median `p50_s` whose 90th percentile is
/// `tail_percent`/100 times the median, clamped to `max_factor` times the
/// median (a longer stage is a stuck stage, which faults model apart).
pub fn lognormal_s(rng: &mut SimRng, p50_s: u64, tail_percent: u32, max_factor: f64) -> u64 {
    if p50_s == 0 {
        // Keep the number of draws per call constant.
        let _ = standard_normal(rng);
        return 0;
    }
    let ratio = (f64::from(tail_percent.max(100)) / 100.0).max(1.0);
    let sigma = ratio.ln() / Z90;
    let x = (p50_s as f64) * (sigma * standard_normal(rng)).exp();
    x.clamp(1.0, p50_s as f64 * max_factor).round() as u64
}

/// True with probability `p` (always consumes one draw).
pub fn chance(rng: &mut SimRng, p: f64) -> bool {
    let u: f64 = rng.random::<f64>();
    u < p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_with_different_labels_differ_and_the_same_label_repeats() {
        let a: u64 = stream(7, "server", 1).random();
        let b: u64 = stream(7, "server", 1).random();
        let c: u64 = stream(7, "server", 2).random();
        let d: u64 = stream(8, "server", 1).random();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn lognormal_median_and_tail_follow_the_measured_percentiles() {
        let mut rng = stream(1, "lognormal", 0);
        let mut xs: Vec<u64> = (0..20_000).map(|_| lognormal_s(&mut rng, 400, 150, 10.0)).collect();
        xs.sort_unstable();
        let p50 = xs[xs.len() / 2] as f64;
        let p90 = xs[xs.len() * 9 / 10] as f64;
        assert!((p50 - 400.0).abs() < 12.0, "p50 {p50}");
        assert!((p90 / p50 - 1.5).abs() < 0.06, "p90/p50 {}", p90 / p50);
    }

    #[test]
    fn lognormal_is_clamped_to_the_stuck_threshold() {
        let mut rng = stream(3, "clamp", 0);
        assert!((0..10_000).all(|_| lognormal_s(&mut rng, 100, 400, 2.0) <= 200));
    }
}
