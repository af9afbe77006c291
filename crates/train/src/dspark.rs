//! Training a DSpark block drafter with candle on self-distilled data.
//!
//! The drafter (see `tandem_model::dspark` and `docs/support-format.md`) reads
//! target features from several layers. They are recomputed here for every
//! training sequence by one target pass over the whole sequence (the kernels
//! are batch invariant, so a prefill row equals the decode row) and kept in
//! memory as f16, optionally cached on disk next to the data.
//!
//! One training example is a block at anchor position `a` of a sequence:
//! slots `[tokens[a], mask × (B−1)]` at positions `a..a+B−1` attend to the
//! context rows `0..a−1` and to all B slots of their own block; slot i is
//! labelled with `argmax[a+i]` (the target's greedy token for position
//! `a+i+1`). Many anchors of one sequence share one attention call with an
//! additive mask over `[context rows ‖ block rows]`. The Markov head is
//! teacher forced: `prev_0 = tokens[a]`, `prev_i = tokens[a+i]`.
//!
//! Loss per supervised slot (DSpark): `w_i·(α·CE + (1−α)·TV(p_d, p_t)) +
//! BCE(c_i, Σ min(p_d, p_t))` with `w_i = exp(−i/4)` and α = 0.1 by default
//! (`--ce-weight`); `--soft-ce` puts the soft cross-entropy −Σ p_t·log p_d
//! (the MTP head's distillation term) in TV's place; `p_t` is the target's
//! distribution restricted to the draft vocabulary (from the final pre-norm
//! residual the data file holds). The confidence head sees its inputs
//! detached, so the BCE trains `conf_proj` only. The token embedding and the
//! output head (draft-vocabulary rows of the target's head) are constants.
//!
//! With copy hints (`--copy-ngram`) each slot's hint, over the true tokens up
//! to its Markov input, adds its learned bias to the logits (and to the
//! confidence); a hint outside the draft vocabulary is an extra column, a
//! label equal to it is trained on that column, and `p_t` covers it too.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use half::f16;
use tandem_engine::Engine;
use tandem_gguf::{GgmlType, Value, ValueType};
use tandem_model::dspark::{DSparkBlockWeights, BLOCK_TENSORS};
use tandem_model::{DSparkConfig, DSparkWeights, ForwardOutput, HiddenTap, LogitRows, Model, RopeStyle, TargetId};

use crate::data::{Dataset, Sequence};
use crate::nn::{draft_vocab, linear, rmsnorm};

#[derive(Debug, Clone)]
pub struct DSparkTrainConfig {
    pub block_size: usize,
    /// Backbone layers. With `init`: 0 keeps the init file's; more adds
    /// blocks that start as the identity (see [`grow_layers`]).
    pub layers: usize,
    /// Target layers tapped (inputs of layer l, 1..=n_layer; llama.cpp's llama
    /// graph can only extract l < n_layer). With `init`: empty keeps the init
    /// file's; otherwise they must be the init file's followed by new ones,
    /// whose `fc` columns start at zero (the drafter starts as it was).
    pub target_layers: Vec<usize>,
    pub rank: usize,
    pub draft_vocab: usize,
    pub mask_token: u32,
    /// Copy hints up to this suffix length (0: as the init file has them).
    pub copy_ngram: usize,
    /// Anchors per sequence per step.
    pub anchors: usize,
    /// Weight α of the cross-entropy on the target's greedy label; the rest
    /// goes to the distribution term.
    pub ce_weight: f32,
    /// Compute the distribution terms with the fused op of
    /// [`crate::dist_loss`] instead of candle's element-wise ops (faster; not
    /// the same bits as a run without it).
    pub fused_loss: bool,
    /// Share of each sequence's anchors drawn with weight `1 − p`, `p` the
    /// target's probability (over the draft vocabulary) of the anchor's
    /// token at the position before it; the rest uniformly. Decoding starts
    /// its cycles right after the drafter's misses (the decoding walk of
    /// [`DSparkReport`]), which the target's uncertainty stands in for.
    pub hard_anchors: f32,
    /// Sequences per optimiser step.
    pub seqs_per_step: usize,
    pub steps: usize,
    pub lr: f64,
    pub holdout: f32,
    pub seed: u64,
    pub weight_type: String,
    /// Continue from this drafter file (its weights, configuration and
    /// draft vocabulary).
    pub init: Option<PathBuf>,
    /// The data in parts of consecutive sequences (e.g. one data file each),
    /// each with the file its target features are cached in (None: computed
    /// every run). Empty: the whole data, not cached.
    pub feature_cache: Vec<FeatureCache>,
    /// The command line, recorded in the file.
    pub command: String,
}

/// Held-out results.
#[derive(Debug, Clone, Default)]
pub struct DSparkReport {
    pub train_positions: usize,
    pub heldout_seqs: usize,
    pub heldout_anchors: usize,
    pub draft_vocab: usize,
    /// Share of held-out generated labels inside the draft vocabulary.
    pub coverage: f64,
    /// Per slot i: share of anchors whose slots 0..=i are all correct.
    pub acceptance: Vec<f64>,
    /// Per slot i: P(slot i correct | slots 0..i−1 correct).
    pub cond_acceptance: Vec<f64>,
    /// Per slot i: mean confidence over anchors with slots 0..i−1 correct.
    pub mean_conf: Vec<f64>,
    /// Expected calibration error (10 bins) over (slot, anchor) pairs with a
    /// correct prefix.
    pub ece: f64,
    /// 1 + Σ_i acceptance[i].
    pub mean_committed: f64,
    /// Cycles of the walk that decoding with full blocks takes through the
    /// held-out sequences: each cycle's anchor is the position after the
    /// previous cycle's committed tokens, so hard positions (right after a
    /// rejection) are anchors more often than uniform anchors make them.
    pub walk_cycles: usize,
    /// Mean committed tokens per cycle of that walk (what `--spec-fixed`
    /// full blocks give on these sequences).
    pub walk_committed: f64,
    /// Per slot i: share of the walk's cycles whose slots 0..=i are right.
    pub walk_acceptance: Vec<f64>,
    pub secs: f64,
    pub feature_secs: f64,
    pub steps: usize,
    pub final_loss: f64,
}

impl std::fmt::Display for DSparkReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "trained {} steps in {:.0} s (features {:.0} s) on {} positions; held out {} anchors in {} greedy sequences",
            self.steps, self.secs, self.feature_secs, self.train_positions, self.heldout_anchors, self.heldout_seqs
        )?;
        writeln!(f, "draft vocabulary {} rows, held-out label coverage {:.1}%", self.draft_vocab, 100.0 * self.coverage)?;
        for i in 0..self.acceptance.len() {
            writeln!(
                f,
                "slot {i}: acceptance {:.1}%, conditional {:.1}%, mean confidence {:.1}%",
                100.0 * self.acceptance[i],
                100.0 * self.cond_acceptance[i],
                100.0 * self.mean_conf[i]
            )?;
        }
        writeln!(f, "mean committed tokens per cycle {:.3}; confidence ECE {:.3}", self.mean_committed, self.ece)?;
        let walk: Vec<String> = self.walk_acceptance.iter().map(|a| format!("{:.1}%", 100.0 * a)).collect();
        writeln!(
            f,
            "decoding walk (full blocks, cycle by cycle): {} cycles, mean committed tokens per cycle {:.3}, acceptance per slot {}",
            self.walk_cycles,
            self.walk_committed,
            walk.join(" / ")
        )?;
        if self.final_loss.is_nan() {
            // no step ran (`--steps 0` / `--epochs 0`): an evaluation only
            write!(f, "no training steps: the held-out figures are the starting file's")
        } else {
            write!(f, "final training loss {:.4}", self.final_loss)
        }
    }
}

/// Target features per sequence: `len × (m·d)` f16, taps concatenated.
pub struct Features {
    pub width: usize,
    pub rows: Vec<Vec<f16>>,
}

const FEAT_MAGIC: &[u8; 8] = b"TDMFEAT1";

/// The slot-0 hint-embedding factors are trained as `copy_embed / SCALE`: a
/// few scalars next to large matrices, they would otherwise move at the
/// matrices' pace (AdamW steps of about the learning rate) and stay near
/// their starting zero for the whole run.
pub const COPY_EMBED_SCALE: f32 = 10.0;

/// The feature cache of `seqs` consecutive sequences of the data: `data` is
/// the data file they came from, beside which the cache lives (None: not
/// cached, computed every run).
#[derive(Debug, Clone)]
pub struct FeatureCache {
    pub seqs: usize,
    pub data: Option<PathBuf>,
}

/// The cache file of the features of `layers` for the data file `data`.
pub fn feature_cache_path(data: &Path, layers: &[usize]) -> PathBuf {
    let l: Vec<String> = layers.iter().map(|l| l.to_string()).collect();
    data.with_extension(format!("dspark-l{}.feats", l.join("-")))
}

/// The layers a feature cache holds: all of `layers` but the final residual
/// (`n_layer`), which every data file already stores as its hidden rows.
pub fn cached_layers(layers: &[usize], n_layer: usize) -> Vec<usize> {
    layers.iter().copied().filter(|&l| l != n_layer).collect()
}

impl Features {
    /// One target pass per sequence (chunks of 256 positions).
    pub fn compute(engine: &Engine, seqs: &[Sequence], target_layers: &[usize]) -> Result<Features> {
        let model = &engine.model;
        let d = model.cfg.d_model;
        let m = target_layers.len();
        let taps: Vec<HiddenTap> = target_layers.iter().map(|&l| HiddenTap::Layer(l - 1)).collect();
        let t0 = Instant::now();
        let mut out = ForwardOutput::default();
        let mut rows = Vec::with_capacity(seqs.len());
        let mut done = 0usize;
        for (si, s) in seqs.iter().enumerate() {
            let n = s.tokens.len();
            let mut cache = model.new_cache(n.max(1));
            let mut f = vec![f16::ZERO; n * m * d];
            let mut c0 = 0;
            while c0 < n {
                let c1 = (c0 + 256).min(n);
                model.forward(&engine.pool, &mut cache, &s.tokens[c0..c1], &LogitRows::None, &taps, &mut out)?;
                crate::data::scatter_taps(&out.hidden, c0, c1 - c0, d, &mut f);
                c0 = c1;
            }
            done += n;
            if (si + 1) % 50 == 0 || si + 1 == seqs.len() {
                eprintln!("features: {}/{} sequences, {done} positions, {:.0} s", si + 1, seqs.len(), t0.elapsed().as_secs_f64());
            }
            rows.push(f);
        }
        Ok(Features { width: m * d, rows })
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("tmp");
        let mut w = BufWriter::new(std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?);
        w.write_all(FEAT_MAGIC)?;
        w.write_all(&(self.width as u64).to_le_bytes())?;
        w.write_all(&(self.rows.len() as u64).to_le_bytes())?;
        for r in &self.rows {
            w.write_all(&(r.len() as u64).to_le_bytes())?;
            let b: Vec<u8> = r.iter().flat_map(|h| h.to_bits().to_le_bytes()).collect();
            w.write_all(&b)?;
        }
        w.flush()?;
        drop(w);
        std::fs::rename(&tmp, path)?;
        Ok(())
    }

    /// Load a cache; None when it does not fit `seqs` / `width`.
    pub fn load(path: &Path, seqs: &[Sequence], width: usize) -> Result<Option<Features>> {
        let mut r = BufReader::new(std::fs::File::open(path)?);
        let mut hdr = [0u8; 24];
        r.read_exact(&mut hdr)?;
        let u = |i: usize| u64::from_le_bytes(hdr[i..i + 8].try_into().unwrap()) as usize;
        if &hdr[..8] != FEAT_MAGIC || u(8) != width || u(16) != seqs.len() {
            return Ok(None);
        }
        let mut rows = Vec::with_capacity(seqs.len());
        for s in seqs {
            let mut b = [0u8; 8];
            r.read_exact(&mut b)?;
            let n = u64::from_le_bytes(b) as usize;
            if n != s.tokens.len() * width {
                return Ok(None);
            }
            let mut v = vec![0u8; n * 2];
            r.read_exact(&mut v)?;
            rows.push(v.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect());
        }
        Ok(Some(Features { width, rows }))
    }
}

/// The target features (inputs of `target_layers`, concatenated) of every
/// sequence of `data`, part by part: each part's cache file is reused when it
/// fits, else the features are computed and saved there. No parts: the whole
/// data, not cached. The tap `n_layer` (the last layer's output, the final
/// residual) is not cached nor recomputed: it is the data file's hidden rows,
/// the same f16 values a target pass would give.
pub fn load_features(engine: &Engine, data: &Dataset, target_layers: &[usize], parts: &[FeatureCache]) -> Result<Features> {
    let d = engine.model.cfg.d_model;
    let n_layer = engine.model.cfg.n_layer;
    let width = target_layers.len() * d;
    let stored = cached_layers(target_layers, n_layer);
    let whole = [FeatureCache { seqs: data.seqs.len(), data: None }];
    let parts = if parts.is_empty() { &whole[..] } else { parts };
    if parts.iter().map(|c| c.seqs).sum::<usize>() != data.seqs.len() {
        bail!("the feature-cache parts do not add up to the {} sequences of the data", data.seqs.len());
    }
    let mut feats = Features { width, rows: Vec::with_capacity(data.seqs.len()) };
    let mut off = 0;
    for c in parts {
        let seqs = &data.seqs[off..off + c.seqs];
        off += c.seqs;
        let part = if stored.is_empty() {
            Features { width: 0, rows: seqs.iter().map(|_| Vec::new()).collect() }
        } else {
            let path = c.data.as_ref().map(|p| feature_cache_path(p, &stored));
            let cached = path.as_ref().and_then(|p| {
                Features::load(p, seqs, stored.len() * d).ok().flatten().inspect(|_| eprintln!("reusing target features {}", p.display()))
            });
            match cached {
                Some(f) => f,
                None => {
                    eprintln!("computing target features (layers {stored:?}) for {} sequences", seqs.len());
                    let f = Features::compute(engine, seqs, &stored)?;
                    if let Some(p) = &path {
                        if let Err(e) = f.save(p) {
                            eprintln!("could not cache features in {}: {e}", p.display());
                        }
                    }
                    f
                }
            }
        };
        if stored.len() == target_layers.len() {
            feats.rows.extend(part.rows);
            continue;
        }
        // splice the final residual (the data's hidden rows) in at its place
        let ms = stored.len();
        for (s, r) in seqs.iter().zip(part.rows) {
            let n = s.tokens.len();
            let mut f = Vec::with_capacity(n * width);
            for p in 0..n {
                let mut k = 0;
                for &l in target_layers {
                    if l == n_layer {
                        f.extend_from_slice(&s.hidden[p * d..(p + 1) * d]);
                    } else {
                        f.extend_from_slice(&r[(p * ms + k) * d..(p * ms + k + 1) * d]);
                        k += 1;
                    }
                }
            }
            feats.rows.push(f);
        }
    }
    Ok(feats)
}

/// One training/evaluation example group: blocks at several anchors of one
/// sequence.
pub struct Blocks {
    /// Context rows `l × (m·d)` (positions 0..l−1).
    pub feats: Vec<f32>,
    pub l: usize,
    /// Anchor positions, each in 1..=l.
    pub anchors: Vec<usize>,
    /// Slot input embeddings, `A·B × d`.
    pub emb: Vec<f32>,
    /// Markov inputs (target ids), `A·B`.
    pub prev: Vec<u32>,
    /// Copy hint per slot: draft row (u32::MAX: none) and suffix length
    /// (empty without hints).
    pub hint_row: Vec<u32>,
    pub hint_len: Vec<u32>,
    /// For a hint outside the draft vocabulary: the target head's row for it
    /// (`A·B × d`, zeros elsewhere) and a 1 in `hint_oov` (empty without hints).
    pub hint_out: Vec<f32>,
    pub hint_oov: Vec<f32>,
    /// Slot 0's hinted token's embedding at each block's first row (`A·B ×
    /// d`, zeros elsewhere; empty without hints): scaled by `copy_embed`, it
    /// joins the anchor's embedding.
    pub hint_in: Vec<f32>,
}

/// Labels of a [`Blocks`].
pub struct Targets {
    /// Draft-vocabulary label per slot (u32::MAX: outside the draft
    /// vocabulary; `draft_vocab`: the slot's out-of-vocabulary copy hint).
    pub labels: Vec<u32>,
    /// Slot is inside the sequence.
    pub valid: Vec<bool>,
    /// Last tap at the slot's position, `A·B × d` (zeros where invalid).
    pub h_last: Vec<f32>,
}

/// The trainable drafter: candle variables mirroring [`DSparkWeights`].
pub struct DSparkNet {
    pub cfg: DSparkConfig,
    fc: Var,
    enc_norm: Var,
    blocks: Vec<Vec<Var>>,
    output_norm: Var,
    /// Draft-vocabulary rows of the head (constant), `V_d × d`.
    output: Tensor,
    w1: Var,
    w2: Var,
    conf_w: Var,
    conf_b: Var,
    /// Copy-hint logit and confidence biases per suffix length (None: no hints).
    copy: Option<(Var, Var)>,
    /// Factor per suffix length on slot 0's hint embedding, divided by
    /// [`COPY_EMBED_SCALE`] (None: not used).
    copy_in: Option<Var>,
    /// The target's final norm (for the target distribution).
    target_norm: Tensor,
    target_eps: f64,
}

impl DSparkNet {
    pub fn new(target: &Model, w: &DSparkWeights, dev: &Device) -> Result<Self> {
        let c = &w.cfg;
        let d = c.d_model;
        let var = |v: &[f32], o: usize, i: usize| -> Result<Var> {
            let t = if i == 1 { Tensor::from_slice(v, o, dev)? } else { Tensor::from_slice(v, (o, i), dev)? };
            Ok(Var::from_tensor(&t)?)
        };
        let blocks = w
            .blocks
            .iter()
            .map(|b| {
                BLOCK_TENSORS
                    .iter()
                    .map(|name| {
                        let (o, i) = c.block_shape(name);
                        var(b.get(name), o, i)
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        let output = w.output.as_ref().context("the trainer needs an own output head (output.weight)")?;
        let (cw, cb) = w.conf.clone().unwrap_or_else(|| (vec![0.0; d + c.markov_rank], 0.0));
        Ok(DSparkNet {
            cfg: c.clone(),
            fc: var(&w.fc, d, c.feat_dim())?,
            enc_norm: var(&w.enc_norm, d, 1)?,
            blocks,
            output_norm: var(&w.output_norm, d, 1)?,
            output: Tensor::from_slice(output, (c.draft_vocab, d), dev)?,
            w1: var(&w.markov_w1, target.cfg.vocab, c.markov_rank)?,
            w2: var(&w.markov_w2, c.draft_vocab, c.markov_rank)?,
            conf_w: var(&cw, 1, d + c.markov_rank)?,
            conf_b: Var::from_tensor(&Tensor::from_slice(&[cb], 1, dev)?)?,
            copy: if c.copy_ngram() > 0 {
                Some((var(&c.copy_bias, c.copy_ngram(), 1)?, var(&c.copy_conf_bias, c.copy_ngram(), 1)?))
            } else {
                None
            },
            copy_in: if c.copy_embed.is_empty() {
                None
            } else {
                let v: Vec<f32> = c.copy_embed.iter().map(|x| x / COPY_EMBED_SCALE).collect();
                Some(var(&v, c.copy_ngram(), 1)?)
            },
            target_norm: Tensor::from_slice(target.output_norm(), d, dev)?,
            target_eps: target.cfg.eps as f64,
        })
    }

    pub fn vars(&self) -> Vec<Var> {
        let mut v = vec![
            self.fc.clone(),
            self.enc_norm.clone(),
            self.output_norm.clone(),
            self.w1.clone(),
            self.w2.clone(),
            self.conf_w.clone(),
            self.conf_b.clone(),
        ];
        for b in &self.blocks {
            v.extend(b.iter().cloned());
        }
        if let Some((b, c)) = &self.copy {
            v.extend([b.clone(), c.clone()]);
        }
        v.extend(self.copy_in.clone());
        v
    }

    /// Back to plain f32 weights (for export).
    pub fn weights(&self, d2t: Option<Vec<u32>>) -> Result<DSparkWeights> {
        let f = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
        let mut cfg = self.cfg.clone();
        if let Some((b, c)) = &self.copy {
            cfg.copy_bias = f(b.as_tensor())?;
            cfg.copy_conf_bias = f(c.as_tensor())?;
        }
        if let Some(ci) = &self.copy_in {
            cfg.copy_embed = f(ci.as_tensor())?.iter().map(|x| x * COPY_EMBED_SCALE).collect();
        }
        Ok(DSparkWeights {
            cfg,
            fc: f(self.fc.as_tensor())?,
            enc_norm: f(self.enc_norm.as_tensor())?,
            blocks: self
                .blocks
                .iter()
                .map(|b| {
                    Ok(DSparkBlockWeights {
                        tensors: BLOCK_TENSORS.iter().zip(b).map(|(n, v)| Ok((n.to_string(), f(v.as_tensor())?))).collect::<Result<_>>()?,
                    })
                })
                .collect::<Result<_>>()?,
            output_norm: f(self.output_norm.as_tensor())?,
            output: Some(f(&self.output)?),
            d2t,
            markov_w1: f(self.w1.as_tensor())?,
            markov_w2: f(self.w2.as_tensor())?,
            conf: Some((f(self.conf_w.as_tensor())?, f(self.conf_b.as_tensor())?[0])),
        })
    }

    fn bw<'a>(&self, blk: &'a [Var], name: &str) -> &'a Tensor {
        let i = BLOCK_TENSORS.iter().position(|n| *n == name).expect("block tensor");
        blk[i].as_tensor()
    }

    /// RoPE tables `(1, P, hd/2)` for the positions.
    fn rope_tables(&self, pos: &[usize], dev: &Device) -> Result<(Tensor, Tensor)> {
        let hd = self.cfg.head_dim;
        let half = hd / 2;
        let mut cs = vec![(0f32, 0f32); half];
        let (mut cos, mut sin) = (Vec::with_capacity(pos.len() * half), Vec::with_capacity(pos.len() * half));
        for &p in pos {
            tandem_kernels::ops::rope_angles(p, hd, self.cfg.rope_base, 1.0, &mut cs);
            cos.extend(cs.iter().map(|x| x.0));
            sin.extend(cs.iter().map(|x| x.1));
        }
        Ok((Tensor::from_vec(cos, (1, pos.len(), half), dev)?, Tensor::from_vec(sin, (1, pos.len(), half), dev)?))
    }

    /// NeoX RoPE on `(h, P, hd)`.
    fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        let half = x.dim(2)? / 2;
        let (x0, x1) = (x.narrow(2, 0, half)?, x.narrow(2, half, half)?);
        let y0 = (x0.broadcast_mul(cos)? - x1.broadcast_mul(sin)?)?;
        let y1 = (x0.broadcast_mul(sin)? + x1.broadcast_mul(cos)?)?;
        Tensor::cat(&[y0, y1], 2)
    }

    /// `(rows, heads·hd)` → per-head RMSNorm → `(heads, rows, hd)`.
    fn heads(x: &Tensor, heads: usize, hd: usize, norm: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
        let rows = x.dim(0)?;
        rmsnorm(&x.reshape((rows, heads, hd))?, norm, eps)?.transpose(0, 1)?.contiguous()
    }

    /// The drafter on all blocks of `b`: returns `e` (`A·B × d`, after the
    /// output norm), the logits (`A·B × V_d`, Markov included) and the
    /// confidence logits (`A·B`).
    pub fn forward(&self, b: &Blocks, dev: &Device) -> Result<(Tensor, Tensor, Tensor)> {
        let c = &self.cfg;
        let (d, nh, nkv, hd, bs) = (c.d_model, c.n_head, c.n_kv_head, c.head_dim, c.block_size);
        let group = nh / nkv;
        let eps = c.eps as f64;
        let scale = 1.0 / (hd as f64).sqrt();
        let n = b.anchors.len() * bs;
        let l = b.l;
        let s = l + n;
        let f = Tensor::from_slice(&b.feats, (l, c.feat_dim()), dev)?;
        let g = rmsnorm(&linear(&f, self.fc.as_tensor())?, self.enc_norm.as_tensor(), eps)?;
        let ctx_pos: Vec<usize> = (0..l).collect();
        let blk_pos: Vec<usize> = b.anchors.iter().flat_map(|&a| (0..bs).map(move |i| a + i)).collect();
        let (cc, cs) = self.rope_tables(&ctx_pos, dev)?;
        let (bc, bsn) = self.rope_tables(&blk_pos, dev)?;
        let mut m = vec![-1e9f32; n * s];
        for (k, &a) in b.anchors.iter().enumerate() {
            for i in 0..bs {
                let row = &mut m[(k * bs + i) * s..(k * bs + i + 1) * s];
                row[..a.min(l)].iter_mut().for_each(|v| *v = 0.0);
                row[l + k * bs..l + (k + 1) * bs].iter_mut().for_each(|v| *v = 0.0);
            }
        }
        let mask = Tensor::from_vec(m, (n, s), dev)?;
        let mut x = Tensor::from_slice(&b.emb, (n, d), dev)?;
        if let Some(ci) = &self.copy_in {
            // slot 0's hint embedding, scaled by the factor of its suffix length
            let (mut has, mut len) = (vec![0f32; n], vec![0u32; n]);
            for k in 0..b.anchors.len() {
                let r = k * bs;
                if b.hint_len[r] > 0 {
                    has[r] = 1.0;
                    len[r] = b.hint_len[r] - 1;
                }
            }
            let scale = ((ci.as_tensor().index_select(&Tensor::from_vec(len, n, dev)?, 0)? * COPY_EMBED_SCALE as f64)?
                * Tensor::from_vec(has, n, dev)?)?;
            let hin = Tensor::from_slice(&b.hint_in, (n, d), dev)?;
            x = (x + hin.broadcast_mul(&scale.unsqueeze(1)?)?)?;
        }
        let rep = |t: Tensor| -> candle_core::Result<Tensor> {
            if group == 1 {
                return Ok(t);
            }
            t.unsqueeze(1)?.expand((nkv, group, s, hd))?.contiguous()?.reshape((nh, s, hd))
        };
        for blk in &self.blocks {
            let kn = self.bw(blk, "attn_k_norm.weight");
            let qn = self.bw(blk, "attn_q_norm.weight");
            let kc = Self::rope(&Self::heads(&linear(&g, self.bw(blk, "attn_k.weight"))?, nkv, hd, kn, eps)?, &cc, &cs)?;
            let vc = linear(&g, self.bw(blk, "attn_v.weight"))?.reshape((l, nkv, hd))?.transpose(0, 1)?;
            let h = rmsnorm(&x, self.bw(blk, "attn_norm.weight"), eps)?;
            let q = Self::rope(&Self::heads(&linear(&h, self.bw(blk, "attn_q.weight"))?, nh, hd, qn, eps)?, &bc, &bsn)?;
            let kb = Self::rope(&Self::heads(&linear(&h, self.bw(blk, "attn_k.weight"))?, nkv, hd, kn, eps)?, &bc, &bsn)?;
            let vb = linear(&h, self.bw(blk, "attn_v.weight"))?.reshape((n, nkv, hd))?.transpose(0, 1)?;
            let k = rep(Tensor::cat(&[kc, kb], 1)?.contiguous()?)?;
            let v = rep(Tensor::cat(&[vc, vb], 1)?.contiguous()?)?;
            let sc = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(&mask)?; // (nh, n, s)
            let p = candle_nn::ops::softmax(&sc, D::Minus1)?;
            let att = p.matmul(&v)?.transpose(0, 1)?.contiguous()?.reshape((n, nh * hd))?;
            x = (x + linear(&att, self.bw(blk, "attn_output.weight"))?)?;
            let h = rmsnorm(&x, self.bw(blk, "ffn_norm.weight"), eps)?;
            let gt = linear(&h, self.bw(blk, "ffn_gate.weight"))?.silu()?;
            let up = linear(&h, self.bw(blk, "ffn_up.weight"))?;
            x = (x + linear(&(gt * up)?, self.bw(blk, "ffn_down.weight"))?)?;
        }
        let e = rmsnorm(&x, self.output_norm.as_tensor(), eps)?;
        let u = linear(&e, &self.output)?;
        let prev = Tensor::from_slice(&b.prev, n, dev)?;
        let w = self.w1.as_tensor().index_select(&prev, 0)?;
        let mut logits = (u + linear(&w, self.w2.as_tensor())?)?;
        let ew = Tensor::cat(&[e.detach(), w.detach()], 1)?;
        let mut z = linear(&ew, self.conf_w.as_tensor())?.squeeze(1)?.broadcast_add(self.conf_b.as_tensor())?;
        if let Some((cb, cc)) = &self.copy {
            // each slot's hinted row gets the bias of its suffix length
            let (mut has, mut len) = (vec![0f32; n], vec![0u32; n]);
            for r in 0..n {
                if b.hint_row[r] != u32::MAX || b.hint_oov[r] > 0.0 {
                    has[r] = 1.0;
                    len[r] = b.hint_len[r] - 1;
                }
            }
            let len = Tensor::from_vec(len, n, dev)?;
            let has = Tensor::from_vec(has, n, dev)?;
            let bias = cb.as_tensor().index_select(&len, 0)?;
            logits = crate::column_add::column_add(&logits, &bias, &b.hint_row)?;
            // a hint outside the draft vocabulary: its own column (−1e9 where there is none)
            let ho = Tensor::from_slice(&b.hint_out, (n, c.d_model), dev)?;
            let oov = Tensor::from_slice(&b.hint_oov, n, dev)?;
            let extra = ((((&e * ho)?.sum(1)? + &bias)? * &oov)? + ((oov - 1.0)? * 1e9)?)?;
            logits = Tensor::cat(&[logits, extra.unsqueeze(1)?], 1)?;
            z = (z + (cc.as_tensor().index_select(&len, 0)? * &has)?)?;
        }
        Ok((e, logits, z))
    }

    /// The target's distribution over the draft vocabulary, `A·B × V_d`
    /// (with copy hints `A·B × (V_d + 1)`: the last column is a hint outside
    /// the draft vocabulary, as in [`Self::forward`]).
    pub fn target_probs(&self, h_last: &[f32], b: &Blocks, n: usize, dev: &Device) -> Result<Tensor> {
        let (hn, mut lg) = self.target_logits(Tensor::from_slice(h_last, (n, self.cfg.d_model), dev)?)?;
        if self.copy.is_some() {
            let ho = Tensor::from_slice(&b.hint_out, (n, self.cfg.d_model), dev)?;
            let oov = Tensor::from_slice(&b.hint_oov, n, dev)?;
            let extra = (((hn * ho)?.sum(1)? * &oov)? + ((oov - 1.0)? * 1e9)?)?;
            lg = Tensor::cat(&[lg, extra.unsqueeze(1)?], 1)?;
        }
        Ok(candle_nn::ops::softmax(&lg, D::Minus1)?)
    }

    /// `1 − max p` of the target's distribution over the draft vocabulary
    /// for each of the final residual rows `h` (f16, `n × d`): how unsure
    /// the target is of its greedy token.
    pub fn unsure(&self, h: &[f16], dev: &Device) -> Result<Vec<f32>> {
        let d = self.cfg.d_model;
        let n = h.len() / d;
        let hf: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        let (_, lg) = self.target_logits(Tensor::from_vec(hf, (n, d), dev)?)?;
        let p = candle_nn::ops::softmax(&lg, D::Minus1)?;
        Ok(p.max(D::Minus1)?.to_vec1::<f32>()?.into_iter().map(|m| 1.0 - m).collect())
    }

    /// The target's output-normed final residual rows and their logits over
    /// the draft rows of its head.
    fn target_logits(&self, h: Tensor) -> Result<(Tensor, Tensor)> {
        let hn = rmsnorm(&h, &self.target_norm, self.target_eps)?;
        let lg = linear(&hn, &self.output)?;
        Ok((hn, lg))
    }

    /// Summed loss over the valid slots and their count.
    pub fn loss(&self, b: &Blocks, t: &Targets, ce_weight: f32, fused: bool, dev: &Device) -> Result<(Tensor, usize)> {
        let bs = self.cfg.block_size;
        let n = t.labels.len();
        let (_, logits, z) = self.forward(b, dev)?;
        let pt = self.target_probs(&t.h_last, b, n, dev)?;
        let (mut cew, mut tvw, mut val, mut lab) = (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0u32; n]);
        let mut count = 0;
        for r in 0..n {
            if !t.valid[r] {
                continue;
            }
            count += 1;
            let wi = (-((r % bs) as f32) / 4.0).exp();
            val[r] = 1.0;
            tvw[r] = (1.0 - ce_weight) * wi;
            if t.labels[r] != u32::MAX {
                cew[r] = ce_weight * wi;
                lab[r] = t.labels[r];
            }
        }
        let tv = |v: Vec<f32>| Tensor::from_vec(v, n, dev);
        let (ce, tvd, soft) = if fused {
            // labels of slots outside the supervision (weight 0) are dropped
            let lab: Vec<u32> = lab.iter().zip(&cew).map(|(&l, &w)| if w > 0.0 { l } else { u32::MAX }).collect();
            let terms = crate::dist_loss::dist_terms(&logits, &pt, &lab)?;
            let col = |i: usize| terms.narrow(1, i, 1)?.squeeze(1);
            (col(0)?, col(1)?, col(2)?.detach())
        } else {
            let lsm = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let pd = lsm.exp()?;
            let ce = lsm.gather(&Tensor::from_vec(lab, (n, 1), dev)?, 1)?.squeeze(1)?.neg()?;
            let tvd = ((&pd - &pt)?.abs()?.sum(1)? * 0.5)?;
            (ce, tvd, pd.minimum(&pt)?.sum(1)?.detach())
        };
        let softplus = (z.relu()? + (z.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
        let bce = (softplus - (soft * &z)?)?;
        let total = ((ce * tv(cew)?)? + (tvd * tv(tvw)?)? + (bce * tv(val)?)?)?.sum_all()?;
        Ok((total, count))
    }
}

/// Build the blocks at `anchors` of sequence `s` (features `f`).
#[allow(clippy::too_many_arguments)]
pub fn make_blocks(
    model: &Model,
    cfg: &DSparkConfig,
    s: &Sequence,
    f: &[f16],
    anchors: &[usize],
    t2d: &[u32],
    mask_emb: &[f32],
) -> (Blocks, Targets) {
    let (d, bs) = (cfg.d_model, cfg.block_size);
    let fd = cfg.feat_dim();
    let len = s.tokens.len();
    let l = anchors.iter().copied().max().unwrap_or(1);
    let feats: Vec<f32> = f[..l * fd].iter().map(|v| v.to_f32()).collect();
    let n = anchors.len() * bs;
    let mut emb = vec![0f32; n * d];
    let mut prev = vec![cfg.mask_token; n];
    let mut labels = vec![u32::MAX; n];
    let mut valid = vec![false; n];
    // slot i's hint is over the text up to its Markov input tokens[a + i]
    let nmax = cfg.copy_ngram();
    let hints = if nmax > 0 { tandem_model::mtp::copy_hints(&s.tokens, len, nmax) } else { Vec::new() };
    let (mut hint_row, mut hint_len) = if nmax > 0 { (vec![u32::MAX; n], vec![0u32; n]) } else { (Vec::new(), Vec::new()) };
    let (mut hint_out, mut hint_oov) = if nmax > 0 { (vec![0f32; n * d], vec![0f32; n]) } else { (Vec::new(), Vec::new()) };
    let mut hint_in = if nmax > 0 { vec![0f32; n * d] } else { Vec::new() };
    let out_w = model.output_weight().view(model.gguf());
    // the target's final residual (before its output norm), from the data file
    let mut h_last = vec![0f32; n * d];
    for (k, &a) in anchors.iter().enumerate() {
        for i in 0..bs {
            let r = k * bs + i;
            let p = a + i;
            if i == 0 {
                model.embed(s.tokens[a], &mut emb[r * d..(r + 1) * d]).expect("token in vocabulary");
            } else {
                emb[r * d..(r + 1) * d].copy_from_slice(mask_emb);
            }
            if p < len {
                prev[r] = s.tokens[p];
                labels[r] = t2d[s.argmax[p] as usize];
                if let (Some(t), k) = hints.get(p).copied().unwrap_or((None, 0)) {
                    hint_len[r] = k as u32;
                    if i == 0 {
                        model.embed(t, &mut hint_in[r * d..(r + 1) * d]).expect("token in vocabulary");
                    }
                    if t2d[t as usize] != u32::MAX {
                        hint_row[r] = t2d[t as usize];
                    } else {
                        // its own column, after the draft rows
                        out_w.row_f32(t as usize, &mut hint_out[r * d..(r + 1) * d]);
                        hint_oov[r] = 1.0;
                        if s.argmax[p] == t {
                            labels[r] = cfg.draft_vocab as u32;
                        }
                    }
                }
                valid[r] = true;
                for (o, v) in h_last[r * d..(r + 1) * d].iter_mut().zip(&s.hidden[p * d..(p + 1) * d]) {
                    *o = v.to_f32();
                }
            }
        }
    }
    (
        Blocks { feats, l, anchors: anchors.to_vec(), emb, prev, hint_row, hint_len, hint_out, hint_oov, hint_in },
        Targets { labels, valid, h_last },
    )
}

/// The draft vocabulary: the `n` most frequent labels of the training split
/// (ties by id), sorted by id.
/// A sequence generated greedily (every generated token is the target's argmax).
fn is_greedy(s: &Sequence) -> bool {
    s.prompt_len >= 1 && (s.prompt_len..s.tokens.len()).all(|p| s.tokens[p] == s.argmax[p - 1])
}

/// Reorder the rows of each head of a q/k matrix from llama's adjacent-pair
/// RoPE layout to NeoX halves (`[out][in]`, `heads × hd` rows).
fn unpermute_rows(w: &mut [f32], heads: usize, hd: usize, cols: usize) {
    let half = hd / 2;
    for h in 0..heads {
        let blk = w[h * hd * cols..(h + 1) * hd * cols].to_vec();
        for j in 0..half {
            for s in 0..2 {
                let src = (2 * j + s) * cols;
                let dst = h * hd * cols + (s * half + j) * cols;
                w[dst..dst + cols].copy_from_slice(&blk[src..src + cols]);
            }
        }
    }
}

/// Give an init drafter more target layers: `layers` must be its own followed
/// by new ones. The new layers' `fc` columns are zero, so the drafter's
/// outputs are unchanged until training moves them.
pub fn extend_target_layers(w: &mut DSparkWeights, layers: &[usize], n_layer: usize) -> Result<()> {
    let old = w.cfg.target_layers.clone();
    if layers.len() <= old.len() || layers[..old.len()] != old[..] {
        bail!("--target-layers {layers:?}: with --init they must be the init file's {old:?} followed by new ones");
    }
    if let Some(&bad) = layers.iter().find(|&&l| l == 0 || l > n_layer) {
        bail!("target layer {bad} out of range (1..={n_layer})");
    }
    if let Some(&dup) = layers.iter().enumerate().find(|(i, l)| layers[..*i].contains(l)).map(|(_, l)| l) {
        bail!("target layer {dup} is listed twice");
    }
    let d = w.cfg.d_model;
    let (wo, wn) = (old.len() * d, layers.len() * d);
    let mut fc = vec![0f32; d * wn];
    for r in 0..d {
        fc[r * wn..r * wn + wo].copy_from_slice(&w.fc[r * wo..(r + 1) * wo]);
    }
    w.fc = fc;
    w.cfg.target_layers = layers.to_vec();
    Ok(())
}

/// Give an init drafter more backbone blocks, appended after its own. Each
/// new block is a copy of the last one with its output projections
/// (`attn_output`, `ffn_down`) at zero: it adds nothing to the residual
/// stream, so the drafter starts as it was, and the copied inner weights
/// give the projections something sensible to learn from.
pub fn grow_layers(w: &mut DSparkWeights, layers: usize) -> Result<()> {
    let have = w.cfg.n_layer;
    if layers < have || layers > 16 {
        bail!("--layers {layers}: with --init the drafter can only grow ({have} layers now, at most 16)");
    }
    let last = w.blocks.last().cloned().context("the init drafter has no blocks")?;
    for _ in have..layers {
        let mut b = last.clone();
        for (name, v) in &mut b.tensors {
            if name == "attn_output.weight" || name == "ffn_down.weight" {
                v.iter_mut().for_each(|x| *x = 0.0);
            }
        }
        w.blocks.push(b);
    }
    w.cfg.n_layer = layers;
    Ok(())
}

/// Train, evaluate on the held-out split, export to `out`.
pub fn train(engine: &Arc<Engine>, data: &Dataset, tc: &DSparkTrainConfig, out: &Path) -> Result<DSparkReport> {
    let t0 = Instant::now();
    let model = &engine.model;
    let tcfg = model.cfg.clone();
    let dev = Device::Cpu;
    let d = tcfg.d_model;
    // split by sequence, fixed seed
    let (train_ids, held, mut rng) = crate::nn::split(data, tc.seed, tc.holdout)?;
    let id = TargetId::new(&tcfg, engine.tokenizer.vocab_hash());
    let init = match &tc.init {
        Some(p) => {
            let g = Arc::new(tandem_gguf::Gguf::open(p).with_context(|| format!("opening {}", p.display()))?);
            // the file must fit this target
            tandem_model::DSparkModel::load(g.clone(), model.clone(), &id)?;
            DSparkWeights::from_gguf(&g, &tcfg)?
        }
        None => {
            if let Some(&bad) = tc.target_layers.iter().find(|&&l| l == 0 || l > tcfg.n_layer) {
                bail!("target layer {bad} out of range (1..={})", tcfg.n_layer);
            }
            if tc.block_size == 0 || tc.block_size > 64 || tc.layers == 0 || tc.rank == 0 || !tc.rank.is_multiple_of(32) {
                bail!("block size 1..=64, at least one layer and a rank that is a multiple of 32 are needed");
            }
            if tc.mask_token as usize >= tcfg.vocab {
                bail!("mask token {} outside the vocabulary", tc.mask_token);
            }
            let dv = if tc.draft_vocab == 0 || tc.draft_vocab >= tcfg.vocab { tcfg.vocab } else { (tc.draft_vocab / 32).max(1) * 32 };
            let d2t = draft_vocab(data, &train_ids, tcfg.vocab, dv);
            let cfg = DSparkConfig {
                n_layer: tc.layers,
                d_model: d,
                n_head: tcfg.n_head,
                n_kv_head: tcfg.n_kv_head,
                head_dim: tcfg.head_dim,
                ffn: tcfg.ffn,
                eps: tcfg.eps,
                rope_base: tcfg.rope_base,
                ctx: tcfg.ctx_train,
                block_size: tc.block_size,
                target_layers: tc.target_layers.clone(),
                sample_from_anchor: true,
                mask_token: tc.mask_token,
                markov_rank: tc.rank,
                draft_vocab: d2t.len(),
                has_conf: true,
                copy_bias: Vec::new(),
                copy_conf_bias: Vec::new(),
                copy_embed: Vec::new(),
            };
            let mut w = DSparkWeights::init_from_target(model, cfg, Some(d2t), tc.seed);
            if tcfg.rope_style == RopeStyle::Pairs {
                // the target's q/k rows are ordered for adjacent-pair RoPE; the drafter uses NeoX halves
                let (nh, nkv, hd) = (tcfg.n_head, tcfg.n_kv_head, tcfg.head_dim);
                for b in &mut w.blocks {
                    for (name, v) in &mut b.tensors {
                        match name.as_str() {
                            "attn_q.weight" => unpermute_rows(v, nh, hd, d),
                            "attn_k.weight" => unpermute_rows(v, nkv, hd, d),
                            _ => {}
                        }
                    }
                }
            }
            w
        }
    };
    let mut init = init;
    if tc.init.is_some() && !tc.target_layers.is_empty() && tc.target_layers != init.cfg.target_layers {
        extend_target_layers(&mut init, &tc.target_layers, tcfg.n_layer)?;
    }
    if tc.init.is_some() && tc.layers != 0 && tc.layers != init.cfg.n_layer {
        grow_layers(&mut init, tc.layers)?;
    }
    match (init.cfg.copy_ngram(), tc.copy_ngram) {
        (_, 0) => {}
        (have, n) if have == n => {}
        (0, n) if n <= tandem_model::dspark::MAX_COPY_NGRAM => {
            init.cfg.copy_bias = (1..=n).map(|k| 3.0 * k as f32).collect();
            init.cfg.copy_conf_bias = vec![0.0; n];
        }
        (0, n) => bail!("--copy-ngram {n}: need 1..={}", tandem_model::dspark::MAX_COPY_NGRAM),
        (have, n) => bail!("--copy-ngram {n}: the init file's copy hints match up to {have}"),
    }
    if !(0.0..=1.0).contains(&tc.ce_weight) {
        bail!("--ce-weight {}: need a weight in 0..=1", tc.ce_weight);
    }
    if !(0.0..=1.0).contains(&tc.hard_anchors) {
        bail!("--hard-anchors {}: need a share in 0..=1", tc.hard_anchors);
    }
    let cfg = init.cfg.clone();
    let d2t: Vec<u32> = init.d2t.clone().unwrap_or_else(|| (0..tcfg.vocab as u32).collect());
    let mut t2d = vec![u32::MAX; tcfg.vocab];
    for (r, &t) in d2t.iter().enumerate() {
        t2d[t as usize] = r as u32;
    }

    // target features
    let tf = Instant::now();
    let feats = load_features(engine, data, &cfg.target_layers, &tc.feature_cache)?;
    // the final residual's features are the data file's hidden rows: check
    // them against a target pass over the first sequence
    if let (Some(s), true) = (data.seqs.first(), cfg.target_layers.contains(&tcfg.n_layer)) {
        let f = Features::compute(engine, std::slice::from_ref(s), &[tcfg.n_layer])?;
        let diff = f.rows[0].iter().zip(&s.hidden).map(|(a, b)| (a.to_f32() - b.to_f32()).abs()).fold(0f32, f32::max);
        eprintln!("features: final residual of a target pass vs the data's hidden rows, max |diff| {diff:.2e}");
        if diff != 0.0 {
            bail!("the data file's hidden rows are not this target's final residual (max |diff| {diff:.2e})");
        }
    }
    let feature_secs = tf.elapsed().as_secs_f64();

    let net = DSparkNet::new(model, &init, &dev)?;
    let mut opt = AdamW::new(net.vars(), ParamsAdamW { lr: tc.lr, weight_decay: 0.0, ..Default::default() })?;
    let mut mask_emb = vec![0f32; d];
    model.embed(cfg.mask_token, &mut mask_emb)?;

    let total = tc.steps;
    let warm = (total / 20).max(1);
    let ckpt = out.with_extension("ckpt.gguf");
    let train_positions: usize = train_ids.iter().map(|&i| data.seqs[i].tokens.len()).sum();
    let mut order: Vec<usize> = Vec::new();
    let mut ema = f64::NAN;
    let mut unsure: HashMap<usize, Vec<f32>> = HashMap::new();
    let tt = Instant::now();
    for step in 0..total {
        let lr = if step < warm {
            tc.lr * (step + 1) as f64 / warm as f64
        } else {
            let t = (step - warm) as f64 / (total - warm).max(1) as f64;
            tc.lr * (0.05 + 0.95 * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()))
        };
        opt.set_learning_rate(lr);
        let mut loss: Option<Tensor> = None;
        let mut count = 0usize;
        for _ in 0..tc.seqs_per_step {
            if order.is_empty() {
                order = train_ids.clone();
                for i in (1..order.len()).rev() {
                    let j = rng.below(i + 1);
                    order.swap(i, j);
                }
            }
            let si = order.pop().unwrap();
            let s = &data.seqs[si];
            let lo = s.prompt_len.max(1);
            let mut cand: Vec<usize> = (lo..s.tokens.len()).collect();
            if cand.is_empty() {
                continue;
            }
            let k = tc.anchors.min(cand.len());
            let hard = (tc.hard_anchors * k as f32).round() as usize;
            if hard > 0 {
                // weighted draws without replacement: the `hard` largest keys
                // u^(1/w) (Efraimidis–Spirakis) go first
                // a pure function of the sequence (the target's frozen head):
                // computed at its first draw, reused at the next epochs'
                let w = match unsure.entry(si) {
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(e) => e.insert(net.unsure(&s.hidden[(lo - 1) * d..(s.tokens.len() - 1) * d], &dev)?),
                };
                let mut keyed: Vec<(f64, usize)> = cand
                    .iter()
                    .zip(w.iter())
                    .map(|(&a, &wi)| ((rng.f32().max(f32::MIN_POSITIVE) as f64).powf(1.0 / (wi as f64).max(1e-6)), a))
                    .collect();
                keyed.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
                cand = keyed.iter().map(|&(_, a)| a).collect();
            }
            for i in hard..k {
                let j = i + rng.below(cand.len() - i);
                cand.swap(i, j);
            }
            cand.truncate(k);
            cand.sort_unstable();
            let (b, t) = make_blocks(model, &cfg, s, &feats.rows[si], &cand, &t2d, &mask_emb);
            let (ls, c) = net.loss(&b, &t, tc.ce_weight, tc.fused_loss, &dev)?;
            count += c;
            loss = Some(match loss {
                None => ls,
                Some(x) => (x + ls)?,
            });
        }
        let Some(loss) = loss else { continue };
        let loss = (loss / count.max(1) as f64)?;
        opt.backward_step(&loss)?;
        let lv = loss.to_scalar::<f32>()? as f64;
        ema = if ema.is_nan() { lv } else { 0.95 * ema + 0.05 * lv };
        let done = step + 1;
        if done % 20 == 0 || done == total {
            let el = tt.elapsed().as_secs_f64();
            eprintln!(
                "training: step {done}/{total}, loss {ema:.4}, lr {lr:.2e}, {el:.0} s, eta {:.0} s",
                el / done as f64 * (total - done) as f64
            );
        }
        if done % 250 == 0 && done < total {
            export(&net, engine, &id, &d2t, tc, None, &ckpt)?;
        }
    }
    eprintln!("evaluating on the held-out split");
    let mut report = evaluate(model, &net, data, &feats, &held, &t2d, &dev)?;
    report.train_positions = train_positions;
    report.draft_vocab = d2t.len();
    report.steps = total;
    report.final_loss = ema;
    report.feature_secs = feature_secs;
    report.secs = t0.elapsed().as_secs_f64();
    export(&net, engine, &id, &d2t, tc, Some(&report), out)?;
    let _ = std::fs::remove_file(&ckpt);
    Ok(report)
}

fn export(
    net: &DSparkNet,
    engine: &Engine,
    id: &TargetId,
    d2t: &[u32],
    tc: &DSparkTrainConfig,
    report: Option<&DSparkReport>,
    out: &Path,
) -> Result<()> {
    let ty = match tc.weight_type.to_ascii_lowercase().as_str() {
        "q8_0" => GgmlType::Q8_0,
        "f16" => GgmlType::F16,
        "f32" => GgmlType::F32,
        other => bail!("--weight-type {other}: choose q8_0, f16 or f32"),
    };
    let full = d2t.len() == engine.model.cfg.vocab && d2t.iter().enumerate().all(|(i, &t)| t as usize == i);
    let w = net.weights((!full).then(|| d2t.to_vec()))?;
    let arr = |v: &[f64]| Value::Array(ValueType::F32, v.iter().map(|&a| Value::F32(a as f32)).collect());
    let mut extra = vec![
        ("tandem-dspark.train.command".to_string(), Value::String(tc.command.clone())),
        ("tandem-dspark.train.seed".to_string(), Value::U64(tc.seed)),
    ];
    if let Some(r) = report {
        extra.push(("tandem-dspark.train.positions".into(), Value::U64(r.train_positions as u64)));
        extra.push(("tandem-dspark.train.steps".into(), Value::U64(r.steps as u64)));
        extra.push(("tandem-dspark.train.seconds".into(), Value::F64(r.secs)));
        extra.push(("tandem-dspark.train.heldout_anchors".into(), Value::U64(r.heldout_anchors as u64)));
        extra.push(("tandem-dspark.train.heldout_acceptance".into(), arr(&r.acceptance)));
        extra.push(("tandem-dspark.train.heldout_conditional_acceptance".into(), arr(&r.cond_acceptance)));
        extra.push(("tandem-dspark.train.heldout_mean_confidence".into(), arr(&r.mean_conf)));
        extra.push(("tandem-dspark.train.heldout_ece".into(), Value::F32(r.ece as f32)));
        extra.push(("tandem-dspark.train.mean_committed".into(), Value::F32(r.mean_committed as f32)));
        extra.push(("tandem-dspark.train.walk_mean_committed".into(), Value::F32(r.walk_committed as f32)));
        extra.push(("tandem-dspark.train.walk_acceptance".into(), arr(&r.walk_acceptance)));
    }
    let g = w.to_gguf(engine.model.gguf(), id, ty, &extra)?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).ok();
    }
    g.write_to(out).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// The cycles that decoding with full blocks takes over a sequence whose
/// anchor `j` (from the first generated position) has an accepted prefix of
/// `run[j]` slots: each cycle commits `run[j] + 1` tokens and the next
/// anchor follows them. Adds the committed tokens and the per-slot accepted
/// cycles to the totals and returns the number of cycles.
fn decoding_walk(run: &[usize], committed: &mut u64, accepted: &mut [u64]) -> u64 {
    let (mut j, mut cycles) = (0, 0);
    while j < run.len() {
        let k = run[j];
        cycles += 1;
        *committed += k as u64 + 1;
        accepted.iter_mut().take(k).for_each(|c| *c += 1);
        j += k + 1;
    }
    cycles
}

/// Held-out acceptance and calibration: every generated position of the
/// greedy held-out sequences with a full block inside the sequence is an
/// anchor (along an accepted prefix the teacher-forced Markov inputs are
/// then exactly the drafted tokens). The same per-anchor results also give
/// the walk that decoding with full blocks takes: cycle after cycle, from the
/// first generated position.
pub fn evaluate(
    model: &Model,
    net: &DSparkNet,
    data: &Dataset,
    feats: &Features,
    held: &[usize],
    t2d: &[u32],
    dev: &Device,
) -> Result<DSparkReport> {
    let cfg = &net.cfg;
    let bs = cfg.block_size;
    let mut mask_emb = vec![0f32; cfg.d_model];
    model.embed(cfg.mask_token, &mut mask_emb)?;
    let mut acc = vec![0u64; bs];
    let (mut cond_n, mut cond_ok, mut conf_sum) = (vec![0u64; bs], vec![0u64; bs], vec![0f64; bs]);
    let (mut bin_n, mut bin_c, mut bin_ok) = (vec![0u64; 10], vec![0f64; 10], vec![0u64; 10]);
    let (mut anchors_n, mut seqs_n) = (0u64, 0usize);
    let (mut cov_n, mut cov_in) = (0u64, 0u64);
    let (mut walk_cycles, mut walk_committed, mut walk_acc) = (0u64, 0u64, vec![0u64; bs]);
    for &si in held {
        let s = &data.seqs[si];
        for &a in &s.argmax[s.prompt_len..] {
            cov_n += 1;
            cov_in += (t2d[a as usize] != u32::MAX) as u64;
        }
        if !is_greedy(s) || s.tokens.len() < bs + 1 {
            continue;
        }
        let lo = s.prompt_len.max(1);
        let hi = s.tokens.len() + 1 - bs; // a + bs <= len
        if lo >= hi {
            continue;
        }
        seqs_n += 1;
        let all: Vec<usize> = (lo..hi).collect();
        // accepted prefix length per anchor, for the walk
        let mut run = vec![0usize; all.len()];
        for chunk in all.chunks(64) {
            let (b, t) = make_blocks(model, cfg, s, &feats.rows[si], chunk, t2d, &mask_emb);
            let (_, logits, z) = net.forward(&b, dev)?;
            let pred = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
            let conf: Vec<f32> = candle_nn::ops::sigmoid(&z)?.to_vec1::<f32>()?;
            for k in 0..chunk.len() {
                anchors_n += 1;
                let mut prefix = true;
                for i in 0..bs {
                    let r = k * bs + i;
                    let ok = t.labels[r] != u32::MAX && pred[r] == t.labels[r];
                    if prefix {
                        cond_n[i] += 1;
                        cond_ok[i] += ok as u64;
                        conf_sum[i] += conf[r] as f64;
                        let bi = ((conf[r] * 10.0) as usize).min(9);
                        bin_n[bi] += 1;
                        bin_c[bi] += conf[r] as f64;
                        bin_ok[bi] += ok as u64;
                    }
                    prefix &= ok;
                    acc[i] += prefix as u64;
                    run[chunk[k] - lo] += prefix as usize;
                }
            }
        }
        walk_cycles += decoding_walk(&run, &mut walk_committed, &mut walk_acc);
    }
    let nn = anchors_n.max(1) as f64;
    let acceptance: Vec<f64> = acc.iter().map(|&c| c as f64 / nn).collect();
    let pairs: u64 = bin_n.iter().sum();
    let ece = (0..10)
        .filter(|&b| bin_n[b] > 0)
        .map(|b| (bin_c[b] / bin_n[b] as f64 - bin_ok[b] as f64 / bin_n[b] as f64).abs() * bin_n[b] as f64 / pairs as f64)
        .sum();
    Ok(DSparkReport {
        heldout_seqs: seqs_n,
        heldout_anchors: anchors_n as usize,
        coverage: cov_in as f64 / cov_n.max(1) as f64,
        mean_committed: 1.0 + acceptance.iter().sum::<f64>(),
        acceptance,
        cond_acceptance: cond_ok.iter().zip(&cond_n).map(|(&o, &n)| o as f64 / n.max(1) as f64).collect(),
        mean_conf: conf_sum.iter().zip(&cond_n).map(|(&c, &n)| c / n.max(1) as f64).collect(),
        ece,
        walk_cycles: walk_cycles as usize,
        walk_committed: walk_committed as f64 / walk_cycles.max(1) as f64,
        walk_acceptance: walk_acc.iter().map(|&c| c as f64 / walk_cycles.max(1) as f64).collect(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::decoding_walk;

    #[test]
    fn the_walk_jumps_over_committed_tokens() {
        // anchors 0..8: cycle at 0 accepts 2 (commits 3), at 3 accepts 0, at 4
        // accepts 4 (commits 5, past the end): three cycles, 9 tokens
        let run = [2, 4, 4, 0, 4, 1, 1, 1];
        let (mut committed, mut acc) = (0u64, vec![0u64; 4]);
        assert_eq!(decoding_walk(&run, &mut committed, &mut acc), 3);
        assert_eq!(committed, 3 + 1 + 5);
        assert_eq!(acc, vec![2, 2, 1, 1]);
        let (mut committed, mut acc) = (0u64, vec![0u64; 4]);
        assert_eq!(decoding_walk(&[], &mut committed, &mut acc), 0);
        assert_eq!(committed, 0);
    }
}
