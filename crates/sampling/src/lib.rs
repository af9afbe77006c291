//! Token sampling: greedy, temperature, top-k, top-p, min-p, with a seeded RNG.
//!
//! The filter order follows llama.cpp's default chain: top-k, top-p and min-p
//! act on the untempered distribution, then the temperature is applied to the
//! survivors. [`Sampler::distribution`] exposes the final distribution so the
//! speculative verifier can do exact rejection sampling against it.

/// A sampling setting out of its range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadParam {
    pub name: &'static str,
    pub why: &'static str,
}

impl std::fmt::Display for BadParam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.name, self.why)
    }
}

impl std::error::Error for BadParam {}

/// Sampling settings. `temperature <= 0` means greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 }
    }
}

impl SamplerParams {
    pub fn greedy() -> Self {
        Self::default()
    }
    /// Refuse settings no sampler means: a temperature that is negative or
    /// not finite, `top_p` or `min_p` outside [0, 1]. Returns the setting's
    /// name and why.
    pub fn check(&self) -> Result<(), BadParam> {
        let bad = |name: &'static str, why: &'static str| Err(BadParam { name, why });
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature", "must be a finite number ≥ 0");
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad("top_p", "must be in [0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "must be in [0, 1]");
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// SplitMix64: small, fast, and the same sequence on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the largest logit (the lowest index among exact ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best as u32
}

/// Natural-log softmax of one entry, computed in f64.
pub fn log_softmax_at(logits: &[f32], ids: &[u32]) -> Vec<f32> {
    let mx = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = mx as f64 + logits.iter().map(|&x| ((x - mx) as f64).exp()).sum::<f64>().ln();
    ids.iter().map(|&i| (logits[i as usize] as f64 - lse) as f32).collect()
}

/// The `n` most likely ids with their log-probabilities, best first.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(idx.len());
    if n == 0 {
        return vec![];
    }
    idx.select_nth_unstable_by(n - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    idx.truncate(n);
    idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    let lp = log_softmax_at(logits, &idx);
    idx.into_iter().zip(lp).collect()
}

#[derive(Debug, Clone)]
pub struct Sampler {
    pub params: SamplerParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        let rng = Rng::new(params.seed);
        Sampler { params, rng }
    }

    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// The final sampling distribution as (id, probability) pairs summing to 1.
    /// For greedy settings it is a point mass on the argmax.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f32)> {
        let p = &self.params;
        if p.is_greedy() {
            return vec![(argmax(logits), 1.0)];
        }
        let mut cand: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_logit);
            cand.truncate(p.top_k);
        }
        cand.sort_by(by_logit);
        // untempered probabilities for top-p / min-p
        let mx = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| ((c.1 - mx) as f64).exp()).collect();
        let z: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= z);
        let mut keep = cand.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, q) in probs.iter().enumerate() {
                cum += q;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let thr = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&q| q >= thr).count().max(1));
        }
        cand.truncate(keep.max(1));
        // temperature on the survivors
        let t = p.temperature as f64;
        let mut w: Vec<f64> = cand.iter().map(|c| ((c.1 - mx) as f64 / t).exp()).collect();
        let z: f64 = w.iter().sum();
        w.iter_mut().for_each(|q| *q /= z);
        cand.iter().zip(w).map(|(c, q)| (c.0, q as f32)).collect()
    }

    /// Draw from a distribution with one uniform number.
    pub fn draw(dist: &[(u32, f32)], u: f64) -> u32 {
        let mut cum = 0f64;
        for &(id, q) in dist {
            cum += q as f64;
            if u < cum {
                return id;
            }
        }
        dist.last().map(|d| d.0).unwrap_or(0)
    }

    /// Choose the next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let dist = self.distribution(logits);
        let u = self.rng.uniform();
        Self::draw(&dist, u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_bad_setting() {
        assert!(SamplerParams::greedy().check().is_ok());
        assert!(SamplerParams { temperature: 1.5, top_p: 0.9, min_p: 0.05, ..Default::default() }.check().is_ok());
        let name = |p: SamplerParams| p.check().unwrap_err().name;
        assert_eq!(name(SamplerParams { temperature: -0.1, ..Default::default() }), "temperature");
        assert_eq!(name(SamplerParams { temperature: f32::NAN, ..Default::default() }), "temperature");
        assert_eq!(name(SamplerParams { temperature: f32::INFINITY, ..Default::default() }), "temperature");
        assert_eq!(name(SamplerParams { top_p: 1.5, ..Default::default() }), "top_p");
        assert_eq!(name(SamplerParams { top_p: f32::NAN, ..Default::default() }), "top_p");
        assert_eq!(name(SamplerParams { min_p: -1.0, ..Default::default() }), "min_p");
    }

    #[test]
    fn greedy_is_argmax_lowest_index_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        let mut s = Sampler::new(SamplerParams::greedy());
        assert_eq!(s.sample(&[0.0, -1.0, 5.0]), 2);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let p = SamplerParams { temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.01, seed: 42 };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p.clone());
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p.clone());
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        let c: Vec<u32> = {
            let mut s = Sampler::new(SamplerParams { seed: 43, ..p });
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        assert_ne!(a, c);
    }

    #[test]
    fn filters_shrink_support() {
        let logits = [5.0, 4.0, 3.0, 0.0, -5.0];
        let s = |p: SamplerParams| Sampler::new(p).distribution(&logits);
        let base = SamplerParams { temperature: 1.0, ..Default::default() };
        assert_eq!(s(base.clone()).len(), 5);
        assert_eq!(s(SamplerParams { top_k: 2, ..base.clone() }).len(), 2);
        assert_eq!(s(SamplerParams { top_p: 0.5, ..base.clone() }).len(), 1);
        assert_eq!(s(SamplerParams { min_p: 0.3, ..base.clone() }).len(), 2);
        let d = s(SamplerParams { temperature: 0.5, ..base });
        let sum: f32 = d.iter().map(|x| x.1).sum();
        assert!((sum - 1.0).abs() < 1e-5);
        assert!(d[0].1 > 0.8);
    }

    #[test]
    fn sampling_frequencies_follow_distribution() {
        let logits = [1.0f32, 0.0, -1.0];
        let mut s = Sampler::new(SamplerParams { temperature: 1.0, seed: 7, ..Default::default() });
        let mut counts = [0usize; 3];
        for _ in 0..30000 {
            counts[s.sample(&logits) as usize] += 1;
        }
        let e: Vec<f64> = logits.iter().map(|&l| (l as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        for i in 0..3 {
            let want = e[i] / z;
            let got = counts[i] as f64 / 30000.0;
            assert!((want - got).abs() < 0.01, "{i}: {got} vs {want}");
        }
    }
}
