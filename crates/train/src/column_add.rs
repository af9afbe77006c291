//! `x[r, cols[r]] += bias[r]`: the copy hints' logit bias without a dense
//! one-hot matrix.
//!
//! The composition it replaces, `x + onehot ⊙ bias` with an `n × V` one-hot,
//! builds and streams three `n × V` matrices forward and two more backward
//! for n nonzero entries. It adds exact zeros everywhere else and its
//! backward sums one nonzero product per row, so this op computes the same
//! bits (up to the sign of a zero).

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// `x` (`n × V`, f32) with `bias[r]` (`n`) added at column `cols[r]` of row r
/// (`u32::MAX`: nothing added). Differentiable in `x` and `bias`.
pub fn column_add(x: &Tensor, bias: &Tensor, cols: &[u32]) -> Result<Tensor> {
    x.apply_op2(bias, ColumnAdd { cols: cols.to_vec() })
}

struct ColumnAdd {
    cols: Vec<u32>,
}

impl CustomOp2 for ColumnAdd {
    fn name(&self) -> &'static str {
        "column-add"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, v) = l1.shape().dims2()?;
        let nb = l2.shape().dims1()?;
        if nb != n || self.cols.len() != n {
            candle_core::bail!("column_add: {n}×{v} matrix, {nb} biases, {} columns", self.cols.len());
        }
        let (x, b) = (crate::nn::contiguous_f32(s1, l1, "column_add: matrix")?, crate::nn::contiguous_f32(s2, l2, "column_add: bias")?);
        let mut out = x.to_vec();
        for (r, &c) in self.cols.iter().enumerate() {
            if c != u32::MAX {
                if c as usize >= v {
                    candle_core::bail!("column_add: column {c} of row {r} outside {v}");
                }
                out[r * v + c as usize] += b[r];
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((n, v))))
    }

    fn bwd(&self, x: &Tensor, _bias: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let n = x.dims2()?.0;
        // the bias's gradient is the matrix's gradient at the row's column (0 where none)
        let idx: Vec<u32> = self.cols.iter().map(|&c| if c == u32::MAX { 0 } else { c }).collect();
        let has: Vec<f32> = self.cols.iter().map(|&c| if c == u32::MAX { 0.0 } else { 1.0 }).collect();
        let picked = grad.contiguous()?.gather(&Tensor::from_vec(idx, (n, 1), x.device())?, 1)?.squeeze(1)?;
        let gb = (picked * Tensor::from_vec(has, n, x.device())?)?;
        Ok((Some(grad.clone()), Some(gb)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// Same bits as the one-hot composition, forward and backward.
    #[test]
    fn matches_the_one_hot_composition_bit_for_bit() -> Result<()> {
        let dev = Device::Cpu;
        let (n, v) = (5, 37);
        let xs: Vec<f32> = (0..n * v).map(|i| ((i * 7919) % 101) as f32 / 13.0 - 3.5).collect();
        let bs = vec![1.5f32, -0.75, 2.0, 0.3, -1.1];
        let cols = [3u32, u32::MAX, 36, 0, 17];
        let weights = Tensor::from_vec((0..n * v).map(|i| ((i * 31) % 17) as f32 / 5.0 - 1.0).collect::<Vec<f32>>(), (n, v), &dev)?;
        let run = |fused: bool| -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
            let x = Var::from_vec(xs.clone(), (n, v), &dev)?;
            let b = Var::from_vec(bs.clone(), n, &dev)?;
            let y = if fused {
                column_add(x.as_tensor(), b.as_tensor(), &cols)?
            } else {
                let mut oh = vec![0f32; n * v];
                for (r, &c) in cols.iter().enumerate() {
                    if c != u32::MAX {
                        oh[r * v + c as usize] = 1.0;
                    }
                }
                let oh = Tensor::from_vec(oh, (n, v), &dev)?;
                (x.as_tensor() + oh.broadcast_mul(&b.as_tensor().unsqueeze(1)?)?)?
            };
            let g = (&y * &weights)?.sum_all()?.backward()?;
            Ok((
                y.flatten_all()?.to_vec1()?,
                g.get(x.as_tensor()).unwrap().flatten_all()?.to_vec1()?,
                g.get(b.as_tensor()).unwrap().to_vec1()?,
            ))
        };
        let (a, b) = (run(false)?, run(true)?);
        let bits = |v: &[f32]| v.iter().map(|f| if *f == 0.0 { 0 } else { f.to_bits() }).collect::<Vec<_>>();
        assert_eq!(bits(&a.0), bits(&b.0), "values");
        assert_eq!(bits(&a.1), bits(&b.1), "gradient of x");
        assert_eq!(bits(&a.2), bits(&b.2), "gradient of the bias");
        Ok(())
    }

    #[test]
    fn bad_columns_and_shapes_are_errors() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 4), candle_core::DType::F32, &dev)?;
        let b = Tensor::zeros(2, candle_core::DType::F32, &dev)?;
        assert!(column_add(&x, &b, &[0, 4]).is_err());
        assert!(column_add(&x, &b, &[0]).is_err());
        assert!(column_add(&x, &Tensor::zeros(3, candle_core::DType::F32, &dev)?, &[0, 1]).is_err());
        Ok(())
    }
}
