//! The DSpark loss's per-slot terms over the draft distribution, fused.
//!
//! Composed from candle ops, `log_softmax`, `exp`, `|p_d − p_t|`, `min`,
//! their sums and their backward passes each stream the whole `n × V`
//! logit matrix (V = 8,192 or more) through memory, and each allocates a
//! fresh, zeroed tensor: a profile of a training run had about a third of
//! its time in those element-wise passes. Here one pass per row computes
//!
//! - `ce`  = −log p_d[label] (0 where the slot has no label),
//! - `dist` = ½·Σ|p_d − p_t| (total variation),
//! - `soft` = Σ min(p_d, p_t), the confidence head's label (no gradient),
//!
//! with `p_d = softmax(logits)`, and one more pass computes the logits'
//! gradient from the gradients of `ce` and `dist`. The sums run in a
//! different order than candle's, so a run with it is not bit for bit a
//! run without (`train dspark --fused-loss`).

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

/// Columns of the result: `ce`, `dist`, `soft`.
pub const TERMS: usize = 3;

/// Per-row `[ce, dist, soft]` (`n × 3`) of `logits` (`n × V`, the draft
/// logits, differentiable) against `pt` (`n × V`, the target's
/// probabilities, a constant). `labels[r]` is the column of row r's label,
/// `u32::MAX` for none. Only `ce` and `dist` carry gradients; detach
/// `soft` before using it.
pub fn dist_terms(logits: &Tensor, pt: &Tensor, labels: &[u32]) -> Result<Tensor> {
    logits.apply_op2(pt, DistTerms { labels: labels.to_vec() })
}

struct DistTerms {
    labels: Vec<u32>,
}

/// A contiguous f32 `n × v` matrix out of a storage.
fn matrix<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<(&'a [f32], usize, usize)> {
    let (n, v) = l.shape().dims2()?;
    Ok((crate::nn::contiguous_f32(s, l, what)?, n, v))
}

/// Rows of `out` (each `width` wide) split over the threads candle uses; `f`
/// gets a row index and its output row. Every row is computed alone, so the
/// split does not change any bit.
fn par_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let n = out.len() / width.max(1);
    let threads = candle_core::utils::get_num_threads().clamp(1, n.max(1));
    let per = n.div_ceil(threads);
    std::thread::scope(|sc| {
        for (t, chunk) in out.chunks_mut(per * width).enumerate() {
            let f = &f;
            sc.spawn(move || {
                for (i, row) in chunk.chunks_exact_mut(width).enumerate() {
                    f(t * per + i, row);
                }
            });
        }
    });
}

/// `p = softmax(l)` into `p`; returns `log Σ exp(l − max)` and the max.
fn softmax_row(l: &[f32], p: &mut [f32]) -> (f32, f32) {
    p.copy_from_slice(l);
    let (mx, s) = tandem_kernels::ops::softmax_inplace(p);
    (s.ln(), mx)
}

/// Σ f(a_i, b_i) with eight running sums (vectorisable, fixed order).
#[inline(always)]
fn sum2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for ((s, xi), yi) in acc.iter_mut().zip(x).zip(y) {
            *s += f(*xi, *yi);
        }
    }
    let mut tail = 0f32;
    for (x, y) in ar.iter().zip(br) {
        tail += f(*x, *y);
    }
    acc.iter().sum::<f32>() + tail
}

thread_local! {
    static ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl CustomOp2 for DistTerms {
    fn name(&self) -> &'static str {
        "dspark-dist-terms"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (lg, n, v) = matrix(s1, l1, "logits")?;
        let (pt, n2, v2) = matrix(s2, l2, "target probabilities")?;
        if (n, v) != (n2, v2) || self.labels.len() != n {
            candle_core::bail!("dist_terms: logits {n}×{v}, target {n2}×{v2}, {} labels", self.labels.len());
        }
        let mut out = vec![0f32; n * TERMS];
        par_rows(&mut out, TERMS, |r, o| {
            ROW.with(|buf| {
                let mut pd = buf.borrow_mut();
                pd.resize(v, 0.0);
                let (l, t) = (&lg[r * v..(r + 1) * v], &pt[r * v..(r + 1) * v]);
                let (lse, mx) = softmax_row(l, &mut pd);
                let lab = self.labels[r];
                o[0] = if (lab as usize) < v { -(l[lab as usize] - mx - lse) } else { 0.0 };
                o[1] = 0.5 * sum2(&pd, t, |a, b| (a - b).abs());
                o[2] = sum2(&pd, t, f32::min);
            })
        });
        Ok((CpuStorage::F32(out), Shape::from((n, TERMS))))
    }

    fn bwd(&self, logits: &Tensor, pt: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = logits.apply_op3_no_bwd(pt, &grad.contiguous()?, &DistGrad { labels: self.labels.clone() })?;
        Ok((Some(g), None))
    }
}

/// The logits' gradient: `g_ce·(p_d − onehot) + g_dist·∂dist/∂logits`, with
/// ∂TV/∂l_j = ½·p_j·(s_j − Σ s_i p_i), s = sign(p_d − p_t) (+1 at 0, as
/// candle's `abs`).
struct DistGrad {
    labels: Vec<u32>,
}

impl CustomOp3 for DistGrad {
    fn name(&self) -> &'static str {
        "dspark-dist-terms-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (lg, n, v) = matrix(s1, l1, "logits")?;
        let (pt, _, _) = matrix(s2, l2, "target probabilities")?;
        let (gr, gn, gw) = matrix(s3, l3, "gradient")?;
        if (gn, gw) != (n, TERMS) {
            candle_core::bail!("dist_terms gradient: {gn}×{gw}, want {n}×{TERMS}");
        }
        let mut out = vec![0f32; n * v];
        par_rows(&mut out, v, |r, o| {
            let (l, t) = (&lg[r * v..(r + 1) * v], &pt[r * v..(r + 1) * v]);
            let lab = self.labels[r];
            // a row without a label has ce = 0, a constant
            let g_ce = if (lab as usize) < v { gr[r * TERMS] } else { 0.0 };
            let g_dist = gr[r * TERMS + 1];
            softmax_row(l, o);
            let s = sum2(o, t, |p, ti| if p >= ti { p } else { -p });
            let h = 0.5 * g_dist;
            o.iter_mut().zip(t).for_each(|(p, ti)| {
                let sj = if *p >= *ti { 1.0 } else { -1.0 };
                *p = g_ce * *p + h * *p * (sj - s);
            });
            if (lab as usize) < v {
                o[lab as usize] -= g_ce;
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((n, v))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var, D};

    /// The candle composition the fused op replaces (crates/train/src/dspark.rs
    /// before it): per-row ce, dist and soft.
    fn composed(logits: &Tensor, pt: &Tensor, labels: &[u32]) -> Result<(Tensor, Tensor, Tensor)> {
        let n = labels.len();
        let lsm = candle_nn::ops::log_softmax(logits, D::Minus1)?;
        let pd = lsm.exp()?;
        let lab: Vec<u32> = labels.iter().map(|&l| if l == u32::MAX { 0 } else { l }).collect();
        let has: Vec<f32> = labels.iter().map(|&l| if l == u32::MAX { 0.0 } else { 1.0 }).collect();
        let ce = (lsm.gather(&Tensor::from_vec(lab, (n, 1), logits.device())?, 1)?.squeeze(1)?.neg()?
            * Tensor::from_vec(has, n, logits.device())?)?;
        let dist = ((&pd - pt)?.abs()?.sum(1)? * 0.5)?;
        let soft = pd.minimum(pt)?.sum(1)?;
        Ok((ce, dist, soft))
    }

    fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: fused {x}, composed {y}");
        }
    }

    #[test]
    fn fused_terms_and_gradient_match_the_candle_composition() -> Result<()> {
        let dev = Device::Cpu;
        let (n, v) = (7, 301);
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32
        };
        let lg: Vec<f32> = (0..n * v).map(|_| 6.0 * rnd() - 3.0).collect();
        let tl: Vec<f32> = (0..n * v).map(|_| 8.0 * rnd() - 4.0).collect();
        let labels: Vec<u32> = (0..n as u32).map(|r| if r == 3 { u32::MAX } else { (r * 37) % v as u32 }).collect();
        let pt = candle_nn::ops::softmax(&Tensor::from_vec(tl, (n, v), &dev)?, D::Minus1)?;
        let wc: Vec<f32> = (0..n).map(|r| 0.3 + r as f32 * 0.1).collect();
        let wd: Vec<f32> = (0..n).map(|r| 1.0 - r as f32 * 0.05).collect();
        {
            let x = Var::from_vec(lg.clone(), (n, v), &dev)?;
            let t = dist_terms(x.as_tensor(), &pt, &labels)?;
            let (ce, dist, soft) = composed(x.as_tensor(), &pt, &labels)?;
            close(&t.narrow(1, 0, 1)?.squeeze(1)?.to_vec1()?, &ce.to_vec1()?, 1e-5, "ce");
            close(&t.narrow(1, 1, 1)?.squeeze(1)?.to_vec1()?, &dist.to_vec1()?, 1e-5, "dist");
            close(&t.narrow(1, 2, 1)?.squeeze(1)?.to_vec1()?, &soft.to_vec1()?, 1e-5, "soft");
            // gradients of a weighted loss (the soft column detached, as in training)
            let w = |v: &[f32]| Tensor::from_slice(v, n, &dev);
            let lf = ((t.narrow(1, 0, 1)?.squeeze(1)? * w(&wc)?)? + (t.narrow(1, 1, 1)?.squeeze(1)? * w(&wd)?)?)?.sum_all()?;
            let lc = ((ce * w(&wc)?)? + (dist * w(&wd)?)?)?.sum_all()?;
            let gf = lf.backward()?.get(x.as_tensor()).unwrap().flatten_all()?.to_vec1::<f32>()?;
            let gc = lc.backward()?.get(x.as_tensor()).unwrap().flatten_all()?.to_vec1::<f32>()?;
            close(&gf, &gc, 1e-5, "gradient");
        }
        Ok(())
    }

    #[test]
    fn each_row_is_computed_alone() -> Result<()> {
        let dev = Device::Cpu;
        let (n, v) = (9, 130);
        let lg: Vec<f32> = (0..n * v).map(|i| ((i * 7919) % 113) as f32 / 17.0 - 3.0).collect();
        let pt = candle_nn::ops::softmax(
            &Tensor::from_vec((0..n * v).map(|i| ((i * 31) % 29) as f32 / 7.0).collect::<Vec<f32>>(), (n, v), &dev)?,
            D::Minus1,
        )?;
        let labels: Vec<u32> = (0..n as u32).map(|r| r * 11).collect();
        let x = Tensor::from_vec(lg, (n, v), &dev)?;
        let all = dist_terms(&x, &pt, &labels)?.flatten_all()?.to_vec1::<f32>()?;
        for r in 0..n {
            let one = dist_terms(&x.narrow(0, r, 1)?.contiguous()?, &pt.narrow(0, r, 1)?.contiguous()?, &labels[r..r + 1])?;
            let one = one.flatten_all()?.to_vec1::<f32>()?;
            assert_eq!(
                one.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                all[r * TERMS..(r + 1) * TERMS].iter().map(|f| f.to_bits()).collect::<Vec<_>>()
            );
        }
        Ok(())
    }

    #[test]
    fn mismatched_shapes_are_an_error() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 5), candle_core::DType::F32, &dev)?;
        let p = Tensor::zeros((2, 4), candle_core::DType::F32, &dev)?;
        assert!(dist_terms(&x, &p, &[0, 1]).is_err());
        assert!(dist_terms(&x, &x, &[0]).is_err());
        Ok(())
    }
}
