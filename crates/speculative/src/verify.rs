//! Acceptance rules. Row i of the verify pass holds the target's logits after
//! `[t, d1..di]`, i.e. the distribution that d_{i+1} (or the correction) is
//! drawn from.

use tandem_sampling::{argmax, Rng, Sampler};

/// Outcome of verifying one draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Draft tokens accepted (a prefix).
    pub accepted: usize,
    /// The target's own token after the accepted prefix: the correction at the
    /// first rejection, or the bonus token when everything was accepted.
    pub next: u32,
}

/// Greedy: accept while d_{i+1} == argmax(row i).
pub fn greedy(rows: &[&[f32]], draft: &[u32]) -> Verdict {
    let mut a = 0;
    while a < draft.len() && argmax(rows[a]) == draft[a] {
        a += 1;
    }
    Verdict { accepted: a, next: argmax(rows[a]) }
}

fn prob(dist: &[(u32, f32)], id: u32) -> f64 {
    dist.iter().find(|d| d.0 == id).map(|d| d.1 as f64).unwrap_or(0.0)
}

/// One position of distribution-exact acceptance.
/// `p` is the target's final sampling distribution, `q` the draft's (None for a
/// deterministic draft, i.e. a point mass on `x`). Returns Ok(()) to accept x,
/// or Err(y) with the token to commit instead.
pub fn accept_one(p: &[(u32, f32)], q: Option<&[(u32, f32)]>, x: u32, rng: &mut Rng) -> Result<(), u32> {
    match q {
        None => {
            // Sample the target and accept iff it equals the draft: exact for point masses.
            let y = Sampler::draw(p, rng.uniform());
            if y == x {
                Ok(())
            } else {
                Err(y)
            }
        }
        Some(q) => {
            let (px, qx) = (prob(p, x), prob(q, x));
            let u = rng.uniform();
            if qx > 0.0 && u * qx < px {
                return Ok(());
            }
            // residual norm(max(0, p − q)); if it has no mass, fall back to p
            let mut res: Vec<(u32, f32)> =
                p.iter().map(|&(id, pv)| (id, (pv as f64 - prob(q, id)).max(0.0) as f32)).filter(|r| r.1 > 0.0).collect();
            let z: f64 = res.iter().map(|r| r.1 as f64).sum();
            if z <= 0.0 {
                return Err(Sampler::draw(p, rng.uniform()));
            }
            res.iter_mut().for_each(|r| r.1 = (r.1 as f64 / z) as f32);
            Err(Sampler::draw(&res, rng.uniform()))
        }
    }
}

/// Distribution-exact verification of a whole draft at temperature > 0.
pub fn sampled(rows: &[&[f32]], draft: &[u32], qs: &[Vec<(u32, f32)>], sampler: &mut Sampler) -> Verdict {
    for (i, &x) in draft.iter().enumerate() {
        let p = sampler.distribution(rows[i]);
        let q = qs.get(i).map(|v| v.as_slice());
        if let Err(y) = accept_one(&p, q, x, sampler.rng()) {
            return Verdict { accepted: i, next: y };
        }
    }
    let p = sampler.distribution(rows[draft.len()]);
    let u = sampler.rng().uniform();
    Verdict { accepted: draft.len(), next: Sampler::draw(&p, u) }
}

/// ds4's opportunistic mode (NOT distribution-exact): commit drafts that match
/// the target's argmax without sampling, then sample normally at the first
/// mismatch.
pub fn opportunistic(rows: &[&[f32]], draft: &[u32], sampler: &mut Sampler) -> Verdict {
    let mut a = 0;
    while a < draft.len() && argmax(rows[a]) == draft[a] {
        a += 1;
    }
    Verdict { accepted: a, next: sampler.sample(rows[a]) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_sampling::SamplerParams;

    /// Pearson chi-square statistic and a conservative bound: the test fails only
    /// if the statistic exceeds the 1e-6 upper quantile (Wilson–Hilferty
    /// approximation), so a correct implementation fails about once in a million runs.
    fn chi2_ok(counts: &[u64], p: &[f64], n: u64) -> (f64, f64) {
        let mut chi = 0.0;
        let mut df = 0usize;
        for (c, &pi) in counts.iter().zip(p) {
            let e = pi * n as f64;
            if e > 0.0 {
                chi += (*c as f64 - e).powi(2) / e;
                df += 1;
            } else {
                assert_eq!(*c, 0, "drew a token of probability 0");
            }
        }
        let k = (df - 1) as f64;
        let z = 4.753_424; // one-sided 1e-6 normal quantile
        let bound = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
        (chi, bound)
    }

    fn dist(w: &[f64]) -> Vec<(u32, f32)> {
        let z: f64 = w.iter().sum();
        w.iter().enumerate().map(|(i, v)| (i as u32, (v / z) as f32)).collect()
    }

    const N: u64 = 200_000;

    #[test]
    fn point_mass_acceptance_reproduces_target_distribution() {
        let p = dist(&[0.30, 0.25, 0.15, 0.1, 0.08, 0.07, 0.05]);
        let mut rng = Rng::new(1);
        let mut counts = vec![0u64; p.len()];
        for i in 0..N {
            let x = (i % 3) as u32; // drafts vary; each is a point mass
            let y = match accept_one(&p, None, x, &mut rng) {
                Ok(()) => x,
                Err(y) => y,
            };
            counts[y as usize] += 1;
        }
        let pf: Vec<f64> = p.iter().map(|d| d.1 as f64).collect();
        let (chi, bound) = chi2_ok(&counts, &pf, N);
        assert!(chi < bound, "chi2 {chi} ≥ {bound}: {counts:?}");
    }

    #[test]
    fn distribution_draft_acceptance_reproduces_target_distribution() {
        let p = dist(&[0.30, 0.25, 0.15, 0.1, 0.08, 0.07, 0.05, 0.0]);
        let q = dist(&[0.05, 0.40, 0.05, 0.2, 0.1, 0.0, 0.1, 0.1]);
        let mut rng = Rng::new(2);
        let mut counts = vec![0u64; p.len()];
        for _ in 0..N {
            let x = Sampler::draw(&q, rng.uniform());
            let y = match accept_one(&p, Some(&q), x, &mut rng) {
                Ok(()) => x,
                Err(y) => y,
            };
            counts[y as usize] += 1;
        }
        let pf: Vec<f64> = p.iter().map(|d| d.1 as f64).collect();
        let (chi, bound) = chi2_ok(&counts, &pf, N);
        assert!(chi < bound, "chi2 {chi} ≥ {bound}: {counts:?}");
    }

    #[test]
    fn whole_draft_first_token_distribution_at_temperature() {
        // Through `sampled`, with real logits and a temperature-0.8 sampler.
        let logits: Vec<f32> = vec![2.0, 1.5, 1.0, 0.2, -0.5, 0.7];
        let params = SamplerParams { temperature: 0.8, ..Default::default() };
        let mut sampler = Sampler::new(SamplerParams { seed: 3, ..params.clone() });
        let p = sampler.distribution(&logits);
        let mut counts = vec![0u64; logits.len()];
        let rows = [logits.as_slice(), logits.as_slice()];
        for i in 0..N {
            let x = (i % 2) as u32 + 1;
            let v = sampled(&rows, &[x], &[], &mut sampler);
            let first = if v.accepted == 1 { x } else { v.next };
            counts[first as usize] += 1;
        }
        let mut pf = vec![0.0; logits.len()];
        p.iter().for_each(|d| pf[d.0 as usize] = d.1 as f64);
        let (chi, bound) = chi2_ok(&counts, &pf, N);
        assert!(chi < bound, "chi2 {chi} ≥ {bound}");
    }

    #[test]
    fn greedy_accepts_matching_prefix() {
        let r0 = [0.0f32, 5.0, 1.0];
        let r1 = [3.0f32, 0.0, 1.0];
        let r2 = [0.0f32, 0.0, 9.0];
        let rows = [&r0[..], &r1[..], &r2[..]];
        assert_eq!(greedy(&rows, &[1, 0]), Verdict { accepted: 2, next: 2 });
        assert_eq!(greedy(&rows, &[1, 2]), Verdict { accepted: 1, next: 0 });
        assert_eq!(greedy(&rows, &[0, 0]), Verdict { accepted: 0, next: 1 });
    }
}
