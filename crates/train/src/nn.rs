//! Small pieces both trainers share: candle ops in the engine's conventions,
//! the held-out split and the reduced draft vocabulary.

use anyhow::{bail, Result};
use candle_core::{Tensor, D};

use crate::corpus::SplitMix;
use crate::data::Dataset;

/// RMSNorm over the last axis: `x / sqrt(mean(x²) + eps) * w`.
pub(crate) fn rmsnorm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)
}

/// The f32 values of a contiguous tensor's storage, as a custom op's
/// `cpu_fwd` receives it (an error for other dtypes or strided layouts).
pub(crate) fn contiguous_f32<'a>(s: &'a candle_core::CpuStorage, l: &candle_core::Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let candle_core::CpuStorage::F32(data) = s else {
        candle_core::bail!("{what}: f32 expected");
    };
    let Some((start, end)) = l.contiguous_offsets() else {
        candle_core::bail!("{what}: contiguous tensor expected");
    };
    Ok(&data[start..end])
}

/// `x · wᵀ` for a weight stored `[out][in]`.
pub(crate) fn linear(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    x.matmul(&w.t()?)
}

/// Split the sequences into training and held-out ids (fixed by `seed`).
/// Returns the generator too: training goes on drawing from it, so the
/// committed support files stay reproducible.
pub(crate) fn split(data: &Dataset, seed: u64, holdout: f32) -> Result<(Vec<usize>, Vec<usize>, SplitMix)> {
    let (train_ids, held, rng) = crate::corpus::split_ids(data.seqs.len(), seed, holdout);
    if train_ids.is_empty() || held.is_empty() {
        bail!("need both training and held-out sequences ({} sequences, holdout {})", data.seqs.len(), holdout);
    }
    Ok((train_ids, held, rng))
}

/// The `n` tokens the target chooses most often in `seqs` (ties by id), sorted:
/// the reduced draft vocabulary (`d2t`).
pub(crate) fn draft_vocab(data: &Dataset, seqs: &[usize], vocab: usize, n: usize) -> Vec<u32> {
    let mut count = vec![0u64; vocab];
    for &i in seqs {
        for &a in &data.seqs[i].argmax {
            count[a as usize] += 1;
        }
    }
    let mut ids: Vec<u32> = (0..vocab as u32).collect();
    ids.sort_by(|&a, &b| count[b as usize].cmp(&count[a as usize]).then(a.cmp(&b)));
    let mut keep: Vec<u32> = ids[..n.min(vocab)].to_vec();
    keep.sort_unstable();
    keep
}
