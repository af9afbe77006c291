//! Training an MTP head with candle on self-distilled data.
//!
//! The head (see `tandem_model::mtp`) is trained on whole sequences: row p
//! takes the target's hidden row `h[p]` and the token `t[p+1]` and must
//! predict `argmax[p+1]`, the target's own next choice. Depth k > 1 trains the
//! chained use: the depth-k row of anchor p takes the depth-(k−1) output of
//! the same anchor and the token `t[p+k]`, predicts `argmax[p+k]`, sits at
//! position p+k−1, and attends to the depth-1 rows 0..=p plus the earlier
//! chained rows of its own anchor — exactly what the runtime cache holds when
//! it drafts a chain.
//!
//! The output is restricted to a reduced draft vocabulary (`d2t`): the target
//! choices that are most frequent in the training split. The target's
//! embedding and head rows are constants here, as at run time.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use indicatif::{ProgressBar, ProgressStyle};
use tandem_engine::Engine;
use tandem_gguf::{GgmlType, Value};
use tandem_model::mtp::{block_shape, copy_hint, CopyWeights, FusedWeights, MtpWeights, BLOCK_TENSORS};
use tandem_model::{Config, RopeStyle};

use crate::data::Dataset;
use crate::dspark::{load_features, FeatureCache, Features};
use crate::nn::{draft_vocab, linear, rmsnorm};

#[derive(Debug, Clone)]
pub struct TrainConfig {
    pub epochs: usize,
    pub seq_len: usize,
    pub batch: usize,
    pub lr: f64,
    pub draft_vocab: usize,
    pub holdout: f32,
    pub depths: usize,
    pub weight_type: String,
    pub seed: u64,
    /// Weight of distillation against the target's whole distribution over
    /// the draft vocabulary (soft cross-entropy); the rest of the loss is the
    /// cross-entropy on the target's chosen token. 0 trains on hard labels
    /// only.
    pub distill: f32,
    /// Continue from this support file (its weights and draft vocabulary)
    /// instead of initialising from the target's last block.
    pub init: Option<std::path::PathBuf>,
    /// Fuse the inputs of these target layers into the head's hidden input
    /// (see `tandem_model::mtp`); a plain `--init` head gains a zero `fc`, so
    /// it starts from exactly what it computed. Empty: as the init file has it.
    pub fused_layers: Vec<usize>,
    /// Where the fused layers' target features are cached, per data file
    /// (as the DSpark trainer's); empty: computed, not cached.
    pub feature_cache: Vec<FeatureCache>,
    /// Give the head copy hints over suffixes of up to this many tokens (see
    /// `tandem_model::mtp`); a head without them gains zero copy weights, so
    /// it starts from exactly what it computed. 0: as the init file has it.
    pub copy_ngram: usize,
    /// The command line, recorded in the file.
    pub command: String,
}

/// Held-out results.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub train_tokens: usize,
    pub heldout_tokens: usize,
    pub draft_vocab: usize,
    /// Share of held-out labels inside the draft vocabulary.
    pub coverage: f64,
    /// Per depth: share of held-out generated positions where the chain up
    /// to this depth is all correct (depth 1 = first-draft acceptance).
    pub chain_acceptance: Vec<f64>,
    /// Per depth: accuracy of that depth alone (teacher-forced inputs).
    pub depth_accuracy: Vec<f64>,
    pub secs: f64,
    pub steps: usize,
    pub final_loss: f64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "trained {} steps in {:.0} s on {} positions; held out {} generated positions",
            self.steps, self.secs, self.train_tokens, self.heldout_tokens
        )?;
        writeln!(f, "draft vocabulary {} rows, held-out label coverage {:.1}%", self.draft_vocab, 100.0 * self.coverage)?;
        for (i, (c, a)) in self.chain_acceptance.iter().zip(&self.depth_accuracy).enumerate() {
            writeln!(f, "depth {}: chain acceptance {:.1}%, accuracy given a correct prefix {:.1}%", i + 1, 100.0 * c, 100.0 * a)?;
        }
        if self.final_loss.is_nan() {
            // no step ran (`--steps 0` / `--epochs 0`): an evaluation only
            write!(f, "no training steps: the held-out figures are the starting file's")
        } else {
            write!(f, "final training loss {:.4}", self.final_loss)
        }
    }
}

/// The trainable head: candle variables mirroring [`MtpWeights`].
pub struct MtpNet {
    cfg: Config,
    enorm: Var,
    hnorm: Var,
    eh_proj: Var,
    block: Vec<Var>,
    head_norm: Var,
    /// Draft-vocabulary rows of the target's head (constant), `V × d`.
    head: Tensor,
    /// The target's final norm (for the teacher distribution).
    target_norm: Tensor,
    /// Fused layers, their norms `(k, d)` and `fc` `(d, k·d)`.
    fused: Option<(Vec<usize>, Var, Var)>,
    /// Copy hints: longest suffix, `copy_norm` `(nmax, d)`, `copy_proj`
    /// `(d, d)`, `copy_len` `(nmax + 1, d)`, and `copy_bias / BIAS_SCALE`
    /// `(nmax)`.
    copy: Option<(usize, Var, Var, Var, Var)>,
}

/// The copy-hint logit biases are trained as `bias / BIAS_SCALE`: AdamW moves
/// every parameter by about the learning rate per step, which would take an
/// epoch to move a logit by one; scaled, a few hundred steps reach the
/// several logits that a long suffix match is worth.
const BIAS_SCALE: f64 = 10.0;

/// One batch: `b` windows of `l` positions.
pub struct Batch {
    pub b: usize,
    pub l: usize,
    /// Target hidden rows, `b·l × d`.
    pub hidden: Vec<f32>,
    /// For a fused head: the fused layers' rows, `b·l × k·d` (else empty).
    pub feats: Vec<f32>,
    /// For a head with copy hints, per depth: the hint's embedding (zero
    /// without one), `b·l × d`, the matched suffix length (0: none), and the
    /// hint's draft row (`u32::MAX`: none, or outside the draft vocabulary).
    pub copy_emb: Vec<Vec<f32>>,
    pub copy_n: Vec<Vec<u32>>,
    pub copy_row: Vec<Vec<u32>>,
    /// For a head with copy hints, per depth: the target head's row of a
    /// hint outside the draft vocabulary (zero otherwise), `b·l × d`, and
    /// whether the row has one. Such a hint gets a logit column of its own,
    /// column `V` after the `V` draft rows, as in the engine's drafter; a
    /// label equal to it is `V`.
    pub copy_out: Vec<Vec<f32>>,
    pub copy_out_mask: Vec<Vec<f32>>,
    /// Per depth k (0-based): embeddings of `t[p+k+1]`, `b·l × d`.
    pub emb: Vec<Vec<f32>>,
    /// Per depth: draft-vocabulary label of row p, and whether it counts.
    pub labels: Vec<Vec<u32>>,
    pub mask: Vec<Vec<f32>>,
    /// Per depth, when distilling: the target's hidden row at the label's
    /// position (its distribution there is the teacher), `b·l × d`, and
    /// whether the row has one.
    pub teach: Vec<Vec<f32>>,
    pub teach_mask: Vec<Vec<f32>>,
    /// Absolute position of row 0 of each window.
    pub pos0: Vec<usize>,
}

impl MtpNet {
    pub fn new(cfg: &Config, w: &MtpWeights, head_rows: Vec<f32>, target_norm: Vec<f32>, dev: &Device) -> Result<Self> {
        let d = cfg.d_model;
        let var = |v: &[f32], shape: (usize, usize)| -> Result<Var> {
            let t = if shape.1 == 1 { Tensor::from_slice(v, shape.0, dev)? } else { Tensor::from_slice(v, shape, dev)? };
            Ok(Var::from_tensor(&t)?)
        };
        let block = w.block.iter().map(|(name, v)| var(v, block_shape(cfg, name))).collect::<Result<Vec<_>>>()?;
        let v = head_rows.len() / d;
        let fused = match &w.fused {
            Some(f) => {
                let k = f.layers.len();
                Some((f.layers.clone(), var(&f.fnorm, (k, d))?, var(&f.fc, (d, k * d))?))
            }
            None => None,
        };
        let copy = match &w.copy {
            Some(c) => {
                let bias: Vec<f32> = c.bias.iter().map(|&b| (b as f64 / BIAS_SCALE) as f32).collect();
                Some((c.nmax, var(&c.norm, (c.nmax, d))?, var(&c.proj, (d, d))?, var(&c.len, (c.nmax + 1, d))?, var(&bias, (c.nmax, 1))?))
            }
            None => None,
        };
        Ok(MtpNet {
            cfg: cfg.clone(),
            enorm: var(&w.enorm, (d, 1))?,
            hnorm: var(&w.hnorm, (d, 1))?,
            eh_proj: var(&w.eh_proj, (d, 2 * d))?,
            block,
            head_norm: var(&w.head_norm, (d, 1))?,
            head: Tensor::from_vec(head_rows, (v, d), dev)?,
            target_norm: Tensor::from_vec(target_norm, d, dev)?,
            fused,
            copy,
        })
    }

    /// Longest suffix of the copy hints (None: a head without them).
    pub fn copy_ngram(&self) -> Option<usize> {
        self.copy.as_ref().map(|c| c.0)
    }

    /// The fused layers (empty: a plain head).
    pub fn fused_layers(&self) -> &[usize] {
        self.fused.as_ref().map_or(&[], |f| &f.0)
    }

    pub fn vars(&self) -> Vec<Var> {
        let mut v = vec![self.enorm.clone(), self.hnorm.clone(), self.eh_proj.clone(), self.head_norm.clone()];
        v.extend(self.block.iter().cloned());
        if let Some((_, n, fc)) = &self.fused {
            v.push(n.clone());
            v.push(fc.clone());
        }
        if let Some((_, n, p, l, b)) = &self.copy {
            v.extend([n.clone(), p.clone(), l.clone(), b.clone()]);
        }
        v
    }

    /// Back to plain f32 weights (for export).
    pub fn weights(&self, layer_index: usize, d2t: Option<Vec<u32>>) -> Result<MtpWeights> {
        let f = |v: &Var| -> Result<Vec<f32>> { Ok(v.as_tensor().flatten_all()?.to_vec1::<f32>()?) };
        Ok(MtpWeights {
            layer_index,
            enorm: f(&self.enorm)?,
            hnorm: f(&self.hnorm)?,
            eh_proj: f(&self.eh_proj)?,
            block: BLOCK_TENSORS.iter().zip(&self.block).map(|(n, v)| Ok((n.to_string(), f(v)?))).collect::<Result<_>>()?,
            head_norm: f(&self.head_norm)?,
            d2t,
            fused: match &self.fused {
                Some((layers, n, fc)) => Some(FusedWeights { layers: layers.clone(), fnorm: f(n)?, fc: f(fc)? }),
                None => None,
            },
            copy: match &self.copy {
                Some((nmax, n, p, l, b)) => Some(CopyWeights {
                    nmax: *nmax,
                    norm: f(n)?,
                    proj: f(p)?,
                    len: f(l)?,
                    bias: f(b)?.iter().map(|&v| (v as f64 * BIAS_SCALE) as f32).collect(),
                }),
                None => None,
            },
        })
    }

    fn bw(&self, name: &str) -> &Tensor {
        let i = BLOCK_TENSORS.iter().position(|n| *n == name).expect("block tensor");
        self.block[i].as_tensor()
    }

    /// RoPE tables for positions `pos0[i] + off + j`: `(b, 1, l, hd/2)` each.
    fn rope_tables(&self, pos0: &[usize], off: usize, l: usize, dev: &Device) -> Result<(Tensor, Tensor)> {
        let c = &self.cfg;
        let half = c.rope_dim / 2;
        let (mut cos, mut sin) = (Vec::with_capacity(pos0.len() * l * half), Vec::with_capacity(pos0.len() * l * half));
        let mut cs = vec![(0f32, 0f32); half];
        for &p in pos0 {
            for j in 0..l {
                tandem_kernels::ops::rope_angles(p + off + j, c.rope_dim, c.rope_base, c.rope_scale, &mut cs);
                cos.extend(cs.iter().map(|x| x.0));
                sin.extend(cs.iter().map(|x| x.1));
            }
        }
        let b = pos0.len();
        Ok((Tensor::from_vec(cos, (b, 1, l, half), dev)?, Tensor::from_vec(sin, (b, 1, l, half), dev)?))
    }

    /// RoPE on `(b, h, l, hd)`, in the target's pairing.
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        let (b, h, l, hd) = x.dims4()?;
        let half = hd / 2;
        let (x0, x1) = match self.cfg.rope_style {
            RopeStyle::Pairs => {
                let x = x.reshape((b, h, l, half, 2))?;
                (x.narrow(4, 0, 1)?.squeeze(4)?, x.narrow(4, 1, 1)?.squeeze(4)?)
            }
            RopeStyle::Halves => (x.narrow(3, 0, half)?, x.narrow(3, half, half)?),
        };
        let y0 = (x0.broadcast_mul(cos)? - x1.broadcast_mul(sin)?)?;
        let y1 = (x0.broadcast_mul(sin)? + x1.broadcast_mul(cos)?)?;
        match self.cfg.rope_style {
            RopeStyle::Pairs => Tensor::stack(&[y0, y1], 4)?.reshape((b, h, l, hd)),
            RopeStyle::Halves => Tensor::cat(&[y0, y1], 3),
        }
    }

    /// The head for all depths: returns per depth the block outputs
    /// `(b·l, d)` and the logits `(b·l, V)`, or `(b·l, V + 1)` for a head
    /// with copy hints (column `V`: a hint outside the draft vocabulary, or
    /// −1e9 for rows without one).
    pub fn forward(&self, batch: &Batch, depths: usize, dev: &Device) -> Result<Vec<(Tensor, Tensor)>> {
        let c = &self.cfg;
        let (b, l, d) = (batch.b, batch.l, c.d_model);
        let (nh, nkv, hd) = (c.n_head, c.n_kv_head, c.head_dim);
        let group = nh / nkv;
        let eps = c.eps as f64;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut h_in = Tensor::from_slice(&batch.hidden, (b * l, d), dev)?;
        if let Some((layers, fnorm, fc)) = &self.fused {
            // h' = h + fc · [fnorm_i(f_i)]: the depth-1 rows only
            let k = layers.len();
            if batch.feats.len() != b * l * k * d {
                bail!("fused head: {} feature values for {} rows of {}", batch.feats.len(), b * l, k * d);
            }
            let f = Tensor::from_slice(&batch.feats, (b * l, k, d), dev)?;
            let f = rmsnorm(&f, fnorm.as_tensor(), eps)?.reshape((b * l, k * d))?;
            h_in = (h_in + linear(&f, fc.as_tensor())?)?;
        }
        let mut keys: Vec<Tensor> = Vec::new();
        let mut vals: Vec<Tensor> = Vec::new();
        let mut outs = Vec::new();
        for k in 0..depths.min(batch.emb.len()) {
            let e = Tensor::from_slice(&batch.emb[k], (b * l, d), dev)?;
            let cat = Tensor::cat(&[rmsnorm(&e, self.enorm.as_tensor(), eps)?, rmsnorm(&h_in, self.hnorm.as_tensor(), eps)?], 1)?;
            let mut x = linear(&cat, self.eh_proj.as_tensor())?;
            // copy hints: per row the norm weight and logit bias of its suffix length
            let mut copy_logit_bias = None;
            if let Some((_, cnorm, cproj, clen, cbias)) = &self.copy {
                // x += copy_proj · copy_norm_n(emb(hint)) + copy_len[n]
                if batch.copy_emb.len() <= k || batch.copy_emb[k].len() != b * l * d {
                    bail!("copy hints: the batch has none for depth {}", k + 1);
                }
                let ce = Tensor::from_slice(&batch.copy_emb[k], (b * l, d), dev)?;
                let cn = Tensor::from_slice(&batch.copy_n[k], b * l, dev)?;
                // rows without a hint have a zero embedding; any norm row will do
                let nidx: Vec<u32> = batch.copy_n[k].iter().map(|&n| n.saturating_sub(1)).collect();
                let nidx = Tensor::from_vec(nidx, b * l, dev)?;
                let normed = rmsnorm(&ce, &cnorm.as_tensor().index_select(&nidx, 0)?, eps)?;
                let add = (linear(&normed, cproj.as_tensor())? + clen.as_tensor().index_select(&cn, 0)?)?;
                x = (x + add)?;
                // logits += copy_bias[n] on the hint's row
                let v = self.head.dim(0)?;
                let mut onehot = vec![0f32; b * l * v];
                for (r, &row) in batch.copy_row[k].iter().enumerate() {
                    if (row as usize) < v {
                        onehot[r * v + row as usize] = 1.0;
                    }
                }
                let onehot = Tensor::from_vec(onehot, (b * l, v), dev)?;
                let rb = (cbias.as_tensor().index_select(&nidx, 0)? * BIAS_SCALE)?.unsqueeze(1)?; // (b·l, 1)
                if batch.copy_out.len() <= k || batch.copy_out[k].len() != b * l * d {
                    bail!("copy hints: the batch has no out-of-vocabulary rows for depth {}", k + 1);
                }
                let co = Tensor::from_slice(&batch.copy_out[k], (b * l, d), dev)?;
                let com = Tensor::from_slice(&batch.copy_out_mask[k], (b * l, 1), dev)?;
                copy_logit_bias = Some((onehot.broadcast_mul(&rb)?, co, com, rb));
            }
            // attention
            let hn = rmsnorm(&x, self.bw("attn_norm.weight"), eps)?;
            let q = linear(&hn, self.bw("attn_q.weight"))?.reshape((b, l, nh, hd))?.transpose(1, 2)?.contiguous()?;
            let kk = linear(&hn, self.bw("attn_k.weight"))?.reshape((b, l, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            let vv = linear(&hn, self.bw("attn_v.weight"))?.reshape((b, l, nkv, hd))?.transpose(1, 2)?.contiguous()?;
            let (cos, sin) = self.rope_tables(&batch.pos0, k, l, dev)?;
            let q = self.rope(&q, &cos, &sin)?;
            let kk = self.rope(&kk, &cos, &sin)?;
            keys.push(kk);
            vals.push(vv);
            let kall = Tensor::cat(&keys, 2)?; // (b, nkv, (k+1)·l, hd)
            let vall = Tensor::cat(&vals, 2)?;
            let s = (k + 1) * l;
            let rep = |t: &Tensor| -> candle_core::Result<Tensor> {
                t.unsqueeze(2)?.expand((b, nkv, group, s, hd))?.contiguous()?.reshape((b, nh, s, hd))
            };
            let (kall, vall) = (rep(&kall)?, rep(&vall)?);
            let scores = (q.matmul(&kall.t()?.contiguous()?)? * scale)?; // (b, nh, l, s)
            let mask = depth_mask(l, k, dev)?;
            let p = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
            let att = p.matmul(&vall)?.transpose(1, 2)?.contiguous()?.reshape((b * l, nh * hd))?;
            let x = (x + linear(&att, self.bw("attn_output.weight"))?)?;
            // feed-forward
            let hn = rmsnorm(&x, self.bw("ffn_norm.weight"), eps)?;
            let g = linear(&hn, self.bw("ffn_gate.weight"))?.silu()?;
            let u = linear(&hn, self.bw("ffn_up.weight"))?;
            let x = (x + linear(&(g * u)?, self.bw("ffn_down.weight"))?)?;
            let xn = rmsnorm(&x, self.head_norm.as_tensor(), eps)?;
            let mut logits = linear(&xn, &self.head)?;
            if let Some((cb, co, com, rb)) = copy_logit_bias {
                // the out-of-vocabulary hint's column: its head row · xn + bias
                let extra = ((xn * co)?.sum_keepdim(1)? + rb)?;
                let extra = (extra.broadcast_mul(&com)? + ((com - 1.0)? * 1e9)?)?;
                logits = Tensor::cat(&[(logits + cb)?, extra], 1)?;
            }
            h_in = x.clone();
            outs.push((x, logits));
        }
        Ok(outs)
    }

    /// The target's distribution over the draft vocabulary from its hidden
    /// rows `(n, d)`: what the head's logits are distilled towards. With
    /// `copy_out` (the batch's out-of-vocabulary hint rows and their mask,
    /// for a head with copy hints) the hint's column is part of it.
    pub fn teacher_probs(&self, hidden: &[f32], n: usize, copy_out: Option<(&[f32], &[f32])>, dev: &Device) -> Result<Tensor> {
        let d = self.cfg.d_model;
        let h = Tensor::from_slice(hidden, (n, d), dev)?;
        let hn = rmsnorm(&h, &self.target_norm, self.cfg.eps as f64)?;
        let mut lg = linear(&hn, &self.head)?;
        if let Some((rows, mask)) = copy_out {
            let co = Tensor::from_slice(rows, (n, d), dev)?;
            let com = Tensor::from_slice(mask, (n, 1), dev)?;
            let extra = ((hn * co)?.sum_keepdim(1)?.broadcast_mul(&com)? + ((com - 1.0)? * 1e9)?)?;
            lg = Tensor::cat(&[lg, extra], 1)?;
        }
        Ok(candle_nn::ops::softmax(&lg, D::Minus1)?.detach())
    }
}

/// Additive mask `(l, (k+1)·l)` for the depth-k queries (0-based k): query p
/// sees depth-0 keys j ≤ p and, for each chained depth 1..=k, the key of its
/// own anchor p.
fn depth_mask(l: usize, k: usize, dev: &Device) -> Result<Tensor> {
    let s = (k + 1) * l;
    let mut m = vec![-1e9f32; l * s];
    for p in 0..l {
        for j in 0..=p {
            m[p * s + j] = 0.0;
        }
        for dk in 1..=k {
            m[p * s + dk * l + p] = 0.0;
        }
    }
    Ok(Tensor::from_vec(m, (l, s), dev)?)
}

/// Masked mean cross-entropy over rows.
fn masked_ce(logits: &Tensor, labels: &[u32], mask: &[f32], dev: &Device) -> Result<Tensor> {
    let n = labels.len();
    let lsm = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let lab = Tensor::from_slice(labels, (n, 1), dev)?;
    let picked = lsm.gather(&lab, 1)?.squeeze(1)?;
    let m = Tensor::from_slice(mask, n, dev)?;
    let cnt = mask.iter().sum::<f32>().max(1.0) as f64;
    Ok(((picked * m)?.sum_all()? * (-1.0 / cnt))?)
}

/// Masked mean soft cross-entropy `−Σ_v p_t(v)·log p_d(v)` over rows.
fn masked_soft_ce(logits: &Tensor, teacher: &Tensor, mask: &[f32], dev: &Device) -> Result<Tensor> {
    let n = mask.len();
    let lsm = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let per_row = (lsm * teacher)?.sum(1)?;
    let m = Tensor::from_slice(mask, n, dev)?;
    let cnt = mask.iter().sum::<f32>().max(1.0) as f64;
    Ok(((per_row * m)?.sum_all()? * (-1.0 / cnt))?)
}

/// Windows over a sequence: (sequence index, start).
fn windows(data: &Dataset, seqs: &[usize], l: usize) -> Vec<(usize, usize)> {
    let mut w = Vec::new();
    for &i in seqs {
        let n = data.seqs[i].tokens.len();
        let mut s = 0;
        while s + 2 <= n {
            w.push((i, s));
            s += l;
        }
    }
    w
}

/// Build a batch from windows. Rows without a label at some depth are masked
/// there; `only_generated` masks prompt positions (for evaluation).
#[allow(clippy::too_many_arguments)]
fn make_batch(
    engine: &Engine,
    data: &Dataset,
    feats: Option<&Features>,
    copy_ngram: Option<usize>,
    wins: &[(usize, usize)],
    l: usize,
    depths: usize,
    t2d: &[u32],
    only_generated: bool,
    distill: bool,
) -> Batch {
    let d = data.d;
    let b = wins.len();
    let fw = feats.map_or(0, |f| f.width);
    let mut bt = Batch {
        b,
        l,
        hidden: vec![0f32; b * l * d],
        feats: vec![0f32; b * l * fw],
        copy_emb: if copy_ngram.is_some() { vec![vec![0f32; b * l * d]; depths] } else { Vec::new() },
        copy_n: if copy_ngram.is_some() { vec![vec![0u32; b * l]; depths] } else { Vec::new() },
        copy_row: if copy_ngram.is_some() { vec![vec![u32::MAX; b * l]; depths] } else { Vec::new() },
        copy_out: if copy_ngram.is_some() { vec![vec![0f32; b * l * d]; depths] } else { Vec::new() },
        copy_out_mask: if copy_ngram.is_some() { vec![vec![0f32; b * l]; depths] } else { Vec::new() },
        emb: vec![vec![0f32; b * l * d]; depths],
        labels: vec![vec![0u32; b * l]; depths],
        mask: vec![vec![0f32; b * l]; depths],
        teach: if distill { vec![vec![0f32; b * l * d]; depths] } else { Vec::new() },
        teach_mask: if distill { vec![vec![0f32; b * l]; depths] } else { Vec::new() },
        pos0: wins.iter().map(|w| w.1).collect(),
    };
    let mut e = vec![0f32; d];
    // rows of the draft vocabulary; a hint outside it is column `v`
    let v = t2d.iter().filter(|&&r| r != u32::MAX).count() as u32;
    let out_w = engine.model.output_weight().view(engine.model.gguf());
    for (wi, &(si, start)) in wins.iter().enumerate() {
        let s = &data.seqs[si];
        let n = s.tokens.len();
        for j in 0..l {
            let p = start + j;
            if p >= n {
                break;
            }
            let row = wi * l + j;
            for (o, h) in bt.hidden[row * d..(row + 1) * d].iter_mut().zip(&s.hidden[p * d..(p + 1) * d]) {
                *o = h.to_f32();
            }
            if let Some(f) = feats {
                for (o, h) in bt.feats[row * fw..(row + 1) * fw].iter_mut().zip(&f.rows[si][p * fw..(p + 1) * fw]) {
                    *o = h.to_f32();
                }
            }
            for k in 0..depths {
                let mut oov_hint = None;
                let q = p + k + 1; // input token position; label = argmax[q]
                if q >= n {
                    break;
                }
                engine.model.embed(s.tokens[q], &mut e).expect("token in vocabulary");
                bt.emb[k][row * d..(row + 1) * d].copy_from_slice(&e);
                if let Some(nmax) = copy_ngram {
                    // the text so far ends with the input token t[q]
                    let (hint, n) = copy_hint(&s.tokens[..=q], nmax);
                    if let Some(t) = hint {
                        engine.model.embed(t, &mut e).expect("token in vocabulary");
                        bt.copy_emb[k][row * d..(row + 1) * d].copy_from_slice(&e);
                        bt.copy_row[k][row] = t2d[t as usize];
                        if t2d[t as usize] == u32::MAX {
                            out_w.row_f32(t as usize, &mut bt.copy_out[k][row * d..(row + 1) * d]);
                            bt.copy_out_mask[k][row] = 1.0;
                            oov_hint = Some(t);
                        }
                    }
                    bt.copy_n[k][row] = n as u32;
                }
                if distill {
                    for (o, h) in bt.teach[k][row * d..(row + 1) * d].iter_mut().zip(&s.hidden[q * d..(q + 1) * d]) {
                        *o = h.to_f32();
                    }
                    bt.teach_mask[k][row] = 1.0;
                }
                let mut dr = t2d[s.argmax[q] as usize];
                if dr == u32::MAX && oov_hint == Some(s.argmax[q]) {
                    dr = v;
                }
                if only_generated {
                    // evaluation: every generated position counts; a label
                    // outside the draft vocabulary (u32::MAX) is a miss
                    bt.labels[k][row] = dr;
                    bt.mask[k][row] = (p >= s.prompt_len) as u8 as f32;
                } else if dr != u32::MAX {
                    bt.labels[k][row] = dr;
                    bt.mask[k][row] = 1.0;
                }
            }
        }
    }
    bt
}

/// The draft vocabulary: the `n` most frequent labels of the training split
/// (ties by id), sorted by id.
/// Train, evaluate on the held-out split, export to `out`.
pub fn train(engine: &Arc<Engine>, data: &Dataset, tc: &TrainConfig, out: &Path) -> Result<Report> {
    let t0 = Instant::now();
    let cfg = engine.model.cfg.clone();
    if cfg.rope_dim != cfg.head_dim {
        bail!("partial RoPE (rope dim {} < head dim {}) is not supported by the trainer", cfg.rope_dim, cfg.head_dim);
    }
    if tc.depths == 0 || tc.depths > 4 {
        bail!("--depths {}: need 1..=4", tc.depths);
    }
    if !(0.0..=1.0).contains(&tc.distill) {
        bail!("--distill {}: need a weight in 0..=1", tc.distill);
    }
    let dev = Device::Cpu;
    let d = cfg.d_model;
    // split by sequence, fixed seed
    let (train_ids, held, mut rng) = crate::nn::split(data, tc.seed, tc.holdout)?;
    let mut init = match &tc.init {
        Some(p) => {
            let g = tandem_gguf::Gguf::open(p).with_context(|| format!("opening {}", p.display()))?;
            // the file must fit this target
            engine.load_mtp_head(p)?;
            MtpWeights::from_gguf(&g, &cfg)?
        }
        None => MtpWeights::init_from_target(&engine.model, tc.seed),
    };
    if !tc.fused_layers.is_empty() {
        match &init.fused {
            Some(f) if f.layers != tc.fused_layers => {
                bail!("--fused-layers {:?}: the init file fuses {:?}", tc.fused_layers, f.layers)
            }
            Some(_) => {}
            None => {
                if let Some(&bad) = tc.fused_layers.iter().find(|&&l| l < 1 || l > cfg.n_layer) {
                    bail!("--fused-layers: layer {bad} out of range (1..={})", cfg.n_layer);
                }
                init.fused = Some(FusedWeights::zero(&tc.fused_layers, d));
            }
        }
    }
    match (&init.copy, tc.copy_ngram) {
        (_, 0) => {}
        (Some(c), n) if c.nmax != n => bail!("--copy-ngram {n}: the init file's copy hints match up to {}", c.nmax),
        (Some(_), _) => {}
        (None, n) if n > 8 => bail!("--copy-ngram {n}: need 1..=8"),
        (None, n) => init.copy = Some(CopyWeights::zero(n, d)),
    }
    let feats = match &init.fused {
        Some(f) => Some(load_features(engine, data, &f.layers, &tc.feature_cache)?),
        None => None,
    };
    let (full, d2t): (bool, Vec<u32>) = match &init.d2t {
        Some(m) if tc.init.is_some() => (false, m.clone()),
        _ if tc.draft_vocab == 0 || tc.draft_vocab >= cfg.vocab => (true, (0..cfg.vocab as u32).collect()),
        _ => (false, draft_vocab(data, &train_ids, cfg.vocab, tc.draft_vocab / 8 * 8)),
    };
    let mut t2d = vec![u32::MAX; cfg.vocab];
    for (r, &t) in d2t.iter().enumerate() {
        t2d[t as usize] = r as u32;
    }
    // the constant head rows
    let hw = engine.model.output_weight().view(engine.model.gguf());
    let mut head_rows = vec![0f32; d2t.len() * d];
    for (r, &t) in d2t.iter().enumerate() {
        hw.row_f32(t as usize, &mut head_rows[r * d..(r + 1) * d]);
    }
    let distill = tc.distill > 0.0;
    let net = MtpNet::new(&cfg, &init, head_rows, engine.model.output_norm().to_vec(), &dev)?;
    let mut opt = AdamW::new(net.vars(), ParamsAdamW { lr: tc.lr, weight_decay: 0.0, ..Default::default() })?;

    let l = tc.seq_len.max(8);
    let mut wins = windows(data, &train_ids, l);
    let steps_per_epoch = wins.len().div_ceil(tc.batch);
    let total = steps_per_epoch * tc.epochs;
    let warm = (total / 20).max(1);
    let pb = ProgressBar::new(total as u64);
    pb.set_style(
        ProgressStyle::with_template("training {bar:30} {pos}/{len} steps, loss {msg} [{elapsed_precise}<{eta_precise}]").unwrap(),
    );
    let depth_w = [1.0f64, 0.8, 0.6, 0.5];
    let mut step = 0usize;
    let mut ema = f64::NAN;
    let ckpt = out.with_extension("ckpt.gguf");
    let train_positions: usize = train_ids.iter().map(|&i| data.seqs[i].tokens.len()).sum();
    for _epoch in 0..tc.epochs {
        // shuffle windows (Fisher-Yates, fixed seed)
        for i in (1..wins.len()).rev() {
            let j = rng.below(i + 1);
            wins.swap(i, j);
        }
        for chunk in wins.chunks(tc.batch) {
            let lr = if step < warm {
                tc.lr * (step + 1) as f64 / warm as f64
            } else {
                let t = (step - warm) as f64 / (total - warm).max(1) as f64;
                tc.lr * (0.05 + 0.95 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()))
            };
            opt.set_learning_rate(lr);
            let batch = make_batch(engine, data, feats.as_ref(), net.copy_ngram(), chunk, l, tc.depths, &t2d, false, distill);
            let outs = net.forward(&batch, tc.depths, &dev)?;
            let mut loss: Option<Tensor> = None;
            for (k, (_, logits)) in outs.iter().enumerate() {
                let mut lk = masked_ce(logits, &batch.labels[k], &batch.mask[k], &dev)?;
                if distill {
                    let co = net.copy_ngram().map(|_| (&batch.copy_out[k][..], &batch.copy_out_mask[k][..]));
                    let pt = net.teacher_probs(&batch.teach[k], batch.b * l, co, &dev)?;
                    let soft = masked_soft_ce(logits, &pt, &batch.teach_mask[k], &dev)?;
                    lk = ((lk * (1.0 - tc.distill as f64))? + (soft * tc.distill as f64)?)?;
                }
                let lk = (lk * depth_w[k])?;
                loss = Some(match loss {
                    None => lk,
                    Some(x) => (x + lk)?,
                });
            }
            let loss = loss.context("no depth")?;
            opt.backward_step(&loss)?;
            let lv = loss.to_scalar::<f32>()? as f64;
            ema = if ema.is_nan() { lv } else { 0.95 * ema + 0.05 * lv };
            step += 1;
            pb.set_message(format!("{ema:.3}"));
            pb.inc(1);
            if pb.is_hidden() && step.is_multiple_of(20) {
                eprintln!("training: step {step}/{total}, loss {ema:.3}, {:.0} s", pb.elapsed().as_secs_f64());
            }
            if step.is_multiple_of(200) {
                export(&net, &cfg, engine, &d2t, full, tc, None, &ckpt)?;
            }
        }
    }
    pb.finish();
    let mut report = evaluate(engine, &net, data, feats.as_ref(), &held, l, tc.depths, &t2d, &dev)?;
    report.train_tokens = train_positions;
    report.draft_vocab = d2t.len();
    report.steps = step;
    report.final_loss = ema;
    report.secs = t0.elapsed().as_secs_f64();
    export(&net, &cfg, engine, &d2t, full, tc, Some(&report), out)?;
    let _ = std::fs::remove_file(&ckpt);
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn export(
    net: &MtpNet,
    cfg: &Config,
    engine: &Engine,
    d2t: &[u32],
    full: bool,
    tc: &TrainConfig,
    report: Option<&Report>,
    out: &Path,
) -> Result<()> {
    let ty = match tc.weight_type.to_ascii_lowercase().as_str() {
        "q8_0" => GgmlType::Q8_0,
        "f16" => GgmlType::F16,
        "f32" => GgmlType::F32,
        other => bail!("--weight-type {other}: choose q8_0, f16 or f32"),
    };
    let w = net.weights(cfg.n_layer, (!full).then(|| d2t.to_vec()))?;
    let mut extra = vec![
        ("tandem-mtp.train.command".to_string(), Value::String(tc.command.clone())),
        ("tandem-mtp.train.seed".to_string(), Value::U64(tc.seed)),
    ];
    if tc.distill > 0.0 {
        extra.push(("tandem-mtp.train.distill".into(), Value::F32(tc.distill)));
    }
    if let Some(r) = report {
        extra.push(("tandem-mtp.train.positions".into(), Value::U64(r.train_tokens as u64)));
        extra.push(("tandem-mtp.train.seconds".into(), Value::F64(r.secs)));
        extra.push((
            "tandem-mtp.train.heldout_chain_acceptance".into(),
            Value::Array(tandem_gguf::ValueType::F32, r.chain_acceptance.iter().map(|&a| Value::F32(a as f32)).collect()),
        ));
    }
    let g = w.to_gguf(cfg, &tandem_model::TargetId::new(cfg, engine.tokenizer.vocab_hash()), ty, &extra)?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    g.write_to(out).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// Held-out acceptance per depth over generated positions.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    engine: &Engine,
    net: &MtpNet,
    data: &Dataset,
    feats: Option<&Features>,
    held: &[usize],
    l: usize,
    depths: usize,
    t2d: &[u32],
    dev: &Device,
) -> Result<Report> {
    let wins = windows(data, held, l);
    let mut chain_ok = vec![0u64; depths];
    let mut depth_ok = vec![0u64; depths];
    let mut depth_n = vec![0u64; depths];
    let mut n = 0u64;
    for chunk in wins.chunks(8) {
        let batch = make_batch(engine, data, feats, net.copy_ngram(), chunk, l, depths, t2d, true, false);
        let outs = net.forward(&batch, depths, dev)?;
        let preds: Vec<Vec<u32>> = outs.iter().map(|(_, lg)| Ok(lg.argmax(D::Minus1)?.to_vec1::<u32>()?)).collect::<Result<_>>()?;
        // `row` and `k` index the per-depth masks, labels and predictions alike
        #[allow(clippy::needless_range_loop)]
        for row in 0..batch.b * l {
            if batch.mask[0][row] == 0.0 {
                continue;
            }
            n += 1;
            let mut all = true;
            for k in 0..depths {
                let ok = batch.mask[k][row] != 0.0 && preds[k][row] == batch.labels[k][row];
                if all && batch.mask[k][row] != 0.0 {
                    depth_n[k] += 1;
                    depth_ok[k] += ok as u64;
                }
                all &= ok;
                chain_ok[k] += all as u64;
            }
        }
    }
    Ok(Report {
        heldout_tokens: n as usize,
        coverage: coverage(data, held, t2d),
        chain_acceptance: chain_ok.iter().map(|&c| c as f64 / n.max(1) as f64).collect(),
        depth_accuracy: depth_ok.iter().zip(&depth_n).map(|(&c, &m)| c as f64 / m.max(1) as f64).collect(),
        ..Default::default()
    })
}

fn coverage(data: &Dataset, held: &[usize], t2d: &[u32]) -> f64 {
    let (mut n, mut c) = (0u64, 0u64);
    for &i in held {
        let s = &data.seqs[i];
        for &a in &s.argmax[s.prompt_len..] {
            n += 1;
            c += (t2d[a as usize] != u32::MAX) as u64;
        }
    }
    c as f64 / n.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a one-hot teacher the soft cross-entropy is the hard one, and a
    /// masked row counts in neither.
    #[test]
    fn soft_ce_with_a_one_hot_teacher_is_the_hard_ce() {
        let dev = Device::Cpu;
        let logits = Tensor::from_vec(vec![0.3f32, -1.0, 2.0, 0.5, 0.1, 0.0, 4.0, -2.0, 1.0], (3, 3), &dev).unwrap();
        let labels = [2u32, 0, 1];
        let mut onehot = vec![0f32; 9];
        for (r, &l) in labels.iter().enumerate() {
            onehot[r * 3 + l as usize] = 1.0;
        }
        let teacher = Tensor::from_vec(onehot, (3, 3), &dev).unwrap();
        let mask = [1.0f32, 0.0, 1.0];
        let scalar = |t: Result<Tensor>| t.unwrap().to_scalar::<f32>().unwrap();
        let hard = scalar(masked_ce(&logits, &labels, &mask, &dev));
        let soft = scalar(masked_soft_ce(&logits, &teacher, &mask, &dev));
        assert!((hard - soft).abs() < 1e-6, "{hard} vs {soft}");
        // and a teacher equal to the model's own distribution is the minimum
        let own = candle_nn::ops::softmax(&logits, D::Minus1).unwrap();
        let at_own = scalar(masked_soft_ce(&logits, &own, &mask, &dev));
        let other = scalar(masked_soft_ce(&(&logits * 1.5).unwrap(), &own, &mask, &dev));
        assert!(at_own < other);
    }
}
