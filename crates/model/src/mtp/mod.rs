//! A multi-token-prediction head (DeepSeek-V3 style, one module): from the
//! target's hidden state at position p and the embedding of the token at
//! p + 1 it predicts the token at p + 2.
//!
//! ```text
//! x = eh_proj · [enorm(emb(t[p+1])) ; hnorm(h[p])]      (2d → d)
//! x = block(x)           one transformer block in the target's layout,
//!                        with its own KV cache (RoPE position p)
//! logits = head(shared_head_norm(x))    the target's head, or the rows of it
//!                                       that `d2t` selects
//! ```
//!
//! Chaining feeds the block's output `x` back in as the next `h`, with the
//! drafted token as the next input. The embedding and output head are the
//! target's: a support file never copies them.
//!
//! Optionally (EAGLE-3's idea) the head also reads earlier target layers,
//! which keep more of the context than the last one, tuned to the next token:
//!
//! ```text
//! h' = h[p] + fc · [fnorm_1(f_1[p]) ; … ; fnorm_k(f_k[p])]      (k·d → d)
//! ```
//!
//! where `f_i` is the input of target layer `fused_layers[i]` (llama.cpp's
//! `dflash.target_layers` convention) and each `fnorm_i` is an RMSNorm with
//! its own slice of `nextn.fnorm.weight`. A zero `fc` is exactly the plain
//! head, so a fused head can be trained on from a plain one. Chained rows
//! (the head's own output as `h`) have no target features and skip the sum.
//!
//! Optionally (a tandem extension) the head also gets a *copy hint*: the token
//! that followed the most recent earlier occurrence of the longest suffix
//! (at most `copy_ngram_max` tokens) of the text so far, and that suffix's
//! length n (0: none found). Text that repeats itself (lists, loops, quoted
//! input) is where a one-block head is weakest and where this hint is right
//! 90% of the time for n = 4 (docs/experiments/002-mtp-head.md §6n):
//!
//! ```text
//! x      += copy_proj · copy_norm_n(emb(hint)) + copy_len[n]   (no hint: copy_len[0])
//! logits += copy_bias[n] on the hint's row                     (if it has one)
//! ```
//!
//! The hint is right far more often for long suffixes than for one token, so
//! each length has its own norm weight and logit bias: how far to trust the
//! hint is learned per n. Zero `copy_proj`, `copy_len` and `copy_bias` are
//! exactly the head without hints.

use std::sync::Arc;

use tandem_gguf::{GgmlType, Gguf};
use tandem_kernels::matmul::matmul;
use tandem_kernels::{ops, ThreadPool};

use crate::kv::KvCache;
use crate::support::{detect_kind, int_array, SupportError, SupportKind, TargetId};
use crate::transformer::{resize, Kv, Layer, SCRATCH};
use crate::weights::{load_vec, WeightRef};
use crate::{Model, ModelError};

pub mod format;
pub use format::*;

/// The copy hint for the row whose input token is the last of `history`:
/// the longest suffix of `history` of at most `nmax` tokens that also occurs
/// earlier, at its most recent earlier occurrence, gives the token that
/// followed it there and the suffix length n. `(None, 0)` when even the last
/// token never occurred before. The trainer and the drafter both call this,
/// so the head sees the same hints in training as at run time.
pub fn copy_hint(history: &[u32], nmax: usize) -> (Option<u32>, usize) {
    let len = history.len();
    for n in (1..=nmax.min(len.saturating_sub(1))).rev() {
        let suffix = &history[len - n..];
        // occurrences ending before the suffix itself, latest first
        for s in (0..len - n).rev() {
            if &history[s..s + n] == suffix {
                return (Some(history[s + n]), n);
            }
        }
    }
    (None, 0)
}

/// [`copy_hint`] for each of the last `m` rows of `history` (row i over
/// `history[..len − m + i + 1]`). A catch-up over a long prompt would cost
/// O(m·len) scans; above a few rows this indexes every n-gram once instead,
/// with the same answers.
pub fn copy_hints(history: &[u32], m: usize, nmax: usize) -> Vec<(Option<u32>, usize)> {
    let len = history.len();
    let m = m.min(len);
    let base = len - m;
    if m <= 4 || nmax == 0 {
        return (0..m).map(|i| copy_hint(&history[..base + i + 1], nmax)).collect();
    }
    // per n: n-gram → end index of its latest occurrence so far
    let mut last: Vec<std::collections::HashMap<&[u32], usize>> = vec![Default::default(); nmax + 1];
    let mut out = Vec::with_capacity(m);
    for end in 0..len {
        if end >= base {
            // row over history[..=end]: the longest suffix seen ending before `end`
            let mut hint = (None, 0);
            for n in (1..=nmax.min(end)).rev() {
                if let Some(&j) = last[n].get(&history[end + 1 - n..=end]) {
                    hint = (Some(history[j + 1]), n);
                    break;
                }
            }
            out.push(hint);
        }
        for n in 1..=nmax.min(end + 1) {
            last[n].insert(&history[end + 1 - n..=end], end);
        }
    }
    out
}

/// A loaded MTP head bound to one target.
pub struct MtpHead {
    gguf: Arc<Gguf>,
    target: Arc<Model>,
    pub layer_index: usize,
    enorm: Vec<f32>,
    hnorm: Vec<f32>,
    eh_proj: WeightRef,
    block: Layer,
    head_norm: Vec<f32>,
    /// Draft row → target token id (None: the full vocabulary).
    d2t: Option<Vec<u32>>,
    /// The target head's rows for `d2t`.
    reduced_head: Option<WeightRef>,
    fused: Option<Fused>,
    copy: Option<Copy>,
}

/// Copy-hint weights of a head (see the module docs).
struct Copy {
    nmax: usize,
    /// `nmax·d`: the RMSNorm weight for hints of suffix length n is row n − 1.
    norm: Vec<f32>,
    /// `d → d`.
    proj: WeightRef,
    /// `(nmax + 1)·d`: one row per suffix length, row 0 for no hint.
    len: Vec<f32>,
    /// `nmax`: the logit bias on the hint's row for suffix length n is entry n − 1.
    bias: Vec<f32>,
    /// Target id → draft row (None: the full vocabulary, row = id); rows
    /// outside the draft vocabulary are `u32::MAX`.
    t2d: Option<Vec<u32>>,
}

/// Fused target features of a head (see the module docs).
struct Fused {
    layers: Vec<usize>,
    /// `k·d`: one RMSNorm weight per fused layer.
    fnorm: Vec<f32>,
    /// `k·d → d`.
    fc: WeightRef,
}

impl std::fmt::Debug for MtpHead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MtpHead").field("layer_index", &self.layer_index).field("draft_vocab", &self.draft_vocab()).finish()
    }
}

impl MtpHead {
    /// Validate `g` against `target` (identified by `id`) and load it.
    pub fn load(g: Arc<Gguf>, target: Arc<Model>, id: &TargetId) -> Result<Self, SupportError> {
        let kind = SupportKind::Mtp;
        let found = detect_kind(&g)?;
        if found != kind {
            return Err(SupportError::Metadata { kind, msg: format!("file holds a {found} drafter, not an MTP head") });
        }
        id.check(&g, kind)?;
        let meta = |msg: String| SupportError::Metadata { kind, msg };
        let n = match g.get(keys::LAYER_INDEX).map(|v| v.as_u64()) {
            Some(Some(n)) => n as usize,
            Some(None) => return Err(meta(format!("{} is not an integer", keys::LAYER_INDEX))),
            None => return Err(meta(format!("missing key {}", keys::LAYER_INDEX))),
        };
        if n > 4096 {
            return Err(meta(format!("layer index {n} is implausible")));
        }
        for t in HEAD_TENSORS.iter().chain(BLOCK_TENSORS.iter()) {
            let name = tensor_name(n, t);
            if g.tensor_info(&name).is_none() {
                return Err(SupportError::MissingTensor { kind, name });
            }
        }
        let cfg = &target.cfg;
        let d = cfg.d_model;
        let terr = |e: ModelError| SupportError::Tensor(kind, e);
        let enorm = load_vec(&g, &tensor_name(n, "nextn.enorm.weight"), d).map_err(terr)?;
        let hnorm = load_vec(&g, &tensor_name(n, "nextn.hnorm.weight"), d).map_err(terr)?;
        let head_norm = load_vec(&g, &tensor_name(n, "nextn.shared_head_norm.weight"), d).map_err(terr)?;
        let eh_proj = WeightRef::load_packed(&g, &tensor_name(n, "nextn.eh_proj.weight"), 2 * d, d).map_err(terr)?;
        let block = Layer::load(&g, cfg, &format!("blk.{n}"), false).map_err(terr)?;

        let d2t_name = tensor_name(n, "nextn.d2t");
        let declared = match g.get(keys::DRAFT_VOCAB).map(|v| v.as_u64()) {
            None => None,
            Some(Some(v)) => Some(v as usize),
            Some(None) => return Err(meta(format!("{} is not an integer", keys::DRAFT_VOCAB))),
        };
        let d2t = match (g.tensor(&d2t_name).ok(), declared) {
            (None, None) => None,
            (None, Some(v)) => return Err(meta(format!("{} is {v} but tensor {d2t_name} is missing", keys::DRAFT_VOCAB))),
            (Some((t, data)), declared) => {
                if t.ty != GgmlType::I32 {
                    return Err(SupportError::BadType { kind, name: d2t_name, ty: t.ty.to_string(), want: "I32" });
                }
                let rows = t.n_elements() as usize;
                if t.dims.len() != 1 || declared.is_some_and(|v| v != rows) {
                    return Err(meta(format!("{d2t_name} has shape {:?}, {} says {:?}", t.dims, keys::DRAFT_VOCAB, declared)));
                }
                if rows == 0 || rows > cfg.vocab {
                    return Err(meta(format!("draft vocabulary of {rows} rows (target vocabulary {})", cfg.vocab)));
                }
                let ids: Vec<u32> = data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32).collect();
                if let Some(&bad) = ids.iter().find(|&&i| i as usize >= cfg.vocab) {
                    return Err(meta(format!("d2t maps to token {} outside the vocabulary of {}", bad as i32, cfg.vocab)));
                }
                Some(ids)
            }
        };
        let reduced_head = match &d2t {
            Some(ids) => Some(target.output_weight().gather_rows(target.gguf(), ids, "mtp.reduced_head").map_err(terr)?),
            None => None,
        };
        let fused = load_fused(&g, n, cfg)?;
        let copy = load_copy(&g, n, cfg, d2t.as_deref())?;
        Ok(MtpHead { gguf: g, target, layer_index: n, enorm, hnorm, eh_proj, block, head_norm, d2t, reduced_head, fused, copy })
    }

    /// The target layers whose inputs the head fuses (empty: a plain head).
    pub fn fused_layers(&self) -> &[usize] {
        self.fused.as_ref().map_or(&[], |f| &f.layers)
    }

    /// Longest suffix the copy hint matches (None: a head without copy hints).
    pub fn copy_ngram(&self) -> Option<usize> {
        self.copy.as_ref().map(|c| c.nmax)
    }

    /// The target hidden rows the head needs, in the order [`MtpHead::forward_fused`]
    /// takes them: the last block's output, then the fused layers' inputs.
    pub fn taps(&self) -> Vec<crate::HiddenTap> {
        let mut t = vec![crate::HiddenTap::Layer(self.target.cfg.n_layer - 1)];
        t.extend(self.fused_layers().iter().map(|&l| crate::HiddenTap::Layer(l - 1)));
        t
    }

    pub fn target(&self) -> &Arc<Model> {
        &self.target
    }

    /// Rows of the head's output (the draft vocabulary).
    pub fn draft_vocab(&self) -> usize {
        self.d2t.as_ref().map_or(self.target.cfg.vocab, |v| v.len())
    }

    /// Target token id of draft row `r`.
    pub fn to_target(&self, r: usize) -> u32 {
        self.d2t.as_ref().map_or(r as u32, |v| v[r])
    }

    /// A cache for the head's block (one layer).
    pub fn new_cache(&self, ctx: usize) -> KvCache {
        KvCache::new(1, self.target.cfg.kv_dim(), ctx.clamp(1, self.target.cfg.ctx_train.max(1)))
    }

    /// Evaluate `m = tokens.len()` rows at positions `cache.len()..`: row i
    /// combines `tokens[i]` (the token after position p0+i) with `hidden`
    /// row i. Writes the block outputs (`m × d`, before the head norm) to
    /// `out_hidden`, and the logits of the last row over the draft vocabulary
    /// to `logits`. No fused features (chained rows, or a plain head).
    pub fn forward(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        tokens: &[u32],
        hidden: &[f32],
        out_hidden: &mut Vec<f32>,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        self.forward_fused(pool, cache, tokens, hidden, None, out_hidden, logits)
    }

    /// [`MtpHead::forward`] with the fused layers' rows: `feats` is `m ×
    /// (k·d)`, per row the k tapped rows in [`MtpHead::fused_layers`] order.
    /// Ignored by a plain head. The rows' tokens are taken as the whole text
    /// so far (copy hints see nothing before them): use
    /// [`MtpHead::forward_ctx`] when there is earlier text.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_fused(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        tokens: &[u32],
        hidden: &[f32],
        feats: Option<&[f32]>,
        out_hidden: &mut Vec<f32>,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        self.forward_ctx(pool, cache, tokens, tokens.len(), hidden, feats, out_hidden, logits).map(|_| ())
    }

    /// [`MtpHead::forward_fused`] for the last `m` tokens of `history`, the
    /// text so far (prompt, committed and drafted tokens), which a head with
    /// copy hints searches.
    ///
    /// When the last row's hint lies outside the draft vocabulary, its logit
    /// (the target head's row for it, plus the copy bias) is appended as row
    /// [`MtpHead::draft_vocab`], and its token is returned: a head can copy
    /// a token it has no row for.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_ctx(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        history: &[u32],
        m: usize,
        hidden: &[f32],
        feats: Option<&[f32]>,
        out_hidden: &mut Vec<f32>,
        logits: &mut Vec<f32>,
    ) -> Result<Option<u32>, ModelError> {
        let cfg = &self.target.cfg;
        let d = cfg.d_model;
        if m == 0 {
            return Ok(None);
        }
        if m > history.len() {
            return Err(ModelError::BadConfig(format!("mtp: {m} rows but a history of {}", history.len())));
        }
        let base = history.len() - m;
        let tokens = &history[base..];
        if hidden.len() != m * d {
            return Err(ModelError::BadConfig(format!("mtp: {} hidden values for {m} rows of {d}", hidden.len())));
        }
        let fused_h;
        let hidden = match (&self.fused, feats) {
            (Some(f), Some(x)) => {
                let w = f.layers.len() * d;
                if x.len() != m * w {
                    return Err(ModelError::BadConfig(format!("mtp: {} feature values for {m} rows of {w}", x.len())));
                }
                let mut normed = vec![0f32; m * w];
                for (i, (a, b)) in x.chunks_exact(d).zip(normed.chunks_exact_mut(d)).enumerate() {
                    let li = i % f.layers.len();
                    ops::rmsnorm(a, &f.fnorm[li * d..(li + 1) * d], cfg.eps, b);
                }
                let mut add = vec![0f32; m * d];
                matmul(pool, &f.fc.view(&self.gguf), &normed, m, &mut add);
                for (a, h) in add.iter_mut().zip(hidden) {
                    *a += h;
                }
                fused_h = add;
                &fused_h[..]
            }
            _ => hidden,
        };
        if cache.len() + m > cache.ctx() {
            return Err(ModelError::ContextFull { have: cache.len(), add: m, ctx: cache.ctx() });
        }
        let p0 = cache.len();
        // copy hints: x += copy_proj · copy_norm_n(emb(hint)) + copy_len[n]
        let mut last_hint = (None, 0);
        let copy_add = match &self.copy {
            Some(c) => {
                let mut normed = vec![0f32; m * d];
                let mut lens = Vec::with_capacity(m);
                let mut e = vec![0f32; d];
                for (i, (hint, n)) in copy_hints(history, m, c.nmax).into_iter().enumerate() {
                    if let Some(t) = hint {
                        self.target.embed(t, &mut e)?;
                        ops::rmsnorm(&e, &c.norm[(n - 1) * d..n * d], cfg.eps, &mut normed[i * d..(i + 1) * d]);
                    }
                    lens.push(n);
                    last_hint = (hint, n);
                }
                let mut add = vec![0f32; m * d];
                matmul(pool, &c.proj.view(&self.gguf), &normed, m, &mut add);
                for (i, &n) in lens.iter().enumerate() {
                    for (a, l) in add[i * d..(i + 1) * d].iter_mut().zip(&c.len[n * d..(n + 1) * d]) {
                        *a += l;
                    }
                }
                Some(add)
            }
            None => None,
        };
        let mut cat = vec![0f32; m * 2 * d];
        let mut e = vec![0f32; d];
        for (i, &t) in tokens.iter().enumerate() {
            self.target.embed(t, &mut e)?;
            ops::rmsnorm(&e, &self.enorm, cfg.eps, &mut cat[i * 2 * d..i * 2 * d + d]);
            ops::rmsnorm(&hidden[i * d..(i + 1) * d], &self.hnorm, cfg.eps, &mut cat[i * 2 * d + d..(i + 1) * 2 * d]);
        }
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            let x = resize(&mut s.x, m * d);
            matmul(pool, &self.eh_proj.view(&self.gguf), &cat, m, x);
            if let Some(add) = &copy_add {
                for (a, b) in x.iter_mut().zip(add) {
                    *a += b;
                }
            }
            let half = cfg.rope_dim / 2;
            s.cs.resize(m * half, (0.0, 0.0));
            for i in 0..m {
                ops::rope_angles(p0 + i, cfg.rope_dim, cfg.rope_base, cfg.rope_scale, &mut s.cs[i * half..(i + 1) * half]);
            }
            self.block.forward(pool, &self.gguf, cfg, &mut Kv::One(&mut *cache), 0, m, s, None).expect("one process");
            cache.commit(m);
            out_hidden.clear();
            out_hidden.extend_from_slice(&s.x[..m * d]);
        });
        let mut hn = vec![0f32; d];
        ops::rmsnorm(&out_hidden[(m - 1) * d..], &self.head_norm, cfg.eps, &mut hn);
        match &self.reduced_head {
            Some(w) => {
                logits.resize(w.n, 0.0);
                matmul(pool, &w.view(&self.gguf), &hn, 1, logits);
            }
            None => self.target.lm_head(pool, &hn, 1, logits),
        }
        // logits += copy_bias[n] on the hint's row; a hint outside the draft
        // vocabulary gets a row of its own, appended after the draft rows
        if let (Some(c), (Some(t), n)) = (&self.copy, last_hint) {
            let row = c.t2d.as_ref().map_or(t, |m| m[t as usize]) as usize;
            match logits.get_mut(row) {
                Some(l) => *l += c.bias[n - 1],
                None => {
                    let w = self.target.output_weight().gather_rows(self.target.gguf(), &[t], "mtp.hint_row")?;
                    let mut l = vec![0f32; 1];
                    matmul(pool, &w.view(self.target.gguf()), &hn, 1, &mut l);
                    logits.push(l[0] + c.bias[n - 1]);
                    return Ok(Some(t));
                }
            }
        }
        Ok(None)
    }
}

/// Read and check the optional fused-feature part of head `n`.
fn load_fused(g: &Gguf, n: usize, cfg: &crate::Config) -> Result<Option<Fused>, SupportError> {
    let kind = SupportKind::Mtp;
    let meta = |msg: String| SupportError::Metadata { kind, msg };
    let present: Vec<String> = FUSED_TENSORS.iter().map(|t| tensor_name(n, t)).filter(|t| g.tensor_info(t).is_some()).collect();
    let layers = match int_array(g, keys::FUSED_LAYERS, kind)? {
        None if present.is_empty() => return Ok(None),
        None => return Err(meta(format!("tensor {} present but no {}", present[0], keys::FUSED_LAYERS))),
        Some(layers) => layers,
    };
    if layers.is_empty() || layers.len() > 16 {
        return Err(meta(format!("{} fused layers", layers.len())));
    }
    for &l in &layers {
        if l < 1 || l > cfg.n_layer as i64 {
            return Err(meta(format!("fused layer {l} out of range ({} layers)", cfg.n_layer)));
        }
    }
    for t in FUSED_TENSORS {
        let name = tensor_name(n, t);
        if g.tensor_info(&name).is_none() {
            return Err(SupportError::MissingTensor { kind, name });
        }
    }
    let (k, d) = (layers.len(), cfg.d_model);
    let terr = |e: ModelError| SupportError::Tensor(kind, e);
    let fnorm = load_vec(g, &tensor_name(n, "nextn.fnorm.weight"), k * d).map_err(terr)?;
    let fc = WeightRef::load_packed(g, &tensor_name(n, "nextn.fc.weight"), k * d, d).map_err(terr)?;
    Ok(Some(Fused { layers: layers.iter().map(|&l| l as usize).collect(), fnorm, fc }))
}

/// Read and check the optional copy-hint part of head `n`.
fn load_copy(g: &Gguf, n: usize, cfg: &crate::Config, d2t: Option<&[u32]>) -> Result<Option<Copy>, SupportError> {
    let kind = SupportKind::Mtp;
    let meta = |msg: String| SupportError::Metadata { kind, msg };
    let present: Vec<String> = COPY_TENSORS.iter().map(|t| tensor_name(n, t)).filter(|t| g.tensor_info(t).is_some()).collect();
    let nmax = match g.get(keys::COPY_NGRAM).map(|v| v.as_u64()) {
        None if present.is_empty() => return Ok(None),
        None => return Err(meta(format!("tensor {} present but no {}", present[0], keys::COPY_NGRAM))),
        Some(None) => return Err(meta(format!("{} is not an integer", keys::COPY_NGRAM))),
        Some(Some(v)) => v as usize,
    };
    if !(1..=8).contains(&nmax) {
        return Err(meta(format!("copy n-gram length {nmax} (need 1..=8)")));
    }
    for t in COPY_TENSORS {
        let name = tensor_name(n, t);
        if g.tensor_info(&name).is_none() {
            return Err(SupportError::MissingTensor { kind, name });
        }
    }
    let d = cfg.d_model;
    let terr = |e: ModelError| SupportError::Tensor(kind, e);
    let norm = load_vec(g, &tensor_name(n, "nextn.copy_norm.weight"), nmax * d).map_err(terr)?;
    let proj = WeightRef::load_packed(g, &tensor_name(n, "nextn.copy_proj.weight"), d, d).map_err(terr)?;
    let len = load_vec(g, &tensor_name(n, "nextn.copy_len.weight"), (nmax + 1) * d).map_err(terr)?;
    let bias = load_vec(g, &tensor_name(n, "nextn.copy_bias.weight"), nmax).map_err(terr)?;
    let t2d = d2t.map(|ids| {
        let mut m = vec![u32::MAX; cfg.vocab];
        for (r, &t) in ids.iter().enumerate() {
            m[t as usize] = r as u32;
        }
        m
    });
    Ok(Some(Copy { nmax, norm, proj, len, bias, t2d }))
}

#[cfg(test)]
mod tests {
    use super::{copy_hint, copy_hints};

    #[test]
    fn copy_hint_takes_the_longest_latest_match() {
        // "a b c d | a b c" → suffix "a b c" matched at 0, hint d, n 3
        assert_eq!(copy_hint(&[1, 2, 3, 4, 1, 2, 3], 4), (Some(4), 3));
        // the most recent of two occurrences wins
        assert_eq!(copy_hint(&[7, 1, 9, 7, 1, 8, 5, 7, 1], 4), (Some(8), 2));
        // capped at nmax
        assert_eq!(copy_hint(&[1, 2, 3, 4, 1, 2, 3], 2), (Some(4), 2));
        // nothing repeats; too short; empty
        assert_eq!(copy_hint(&[1, 2, 3], 4), (None, 0));
        assert_eq!(copy_hint(&[5], 4), (None, 0));
        assert_eq!(copy_hint(&[], 4), (None, 0));
        // a run: the suffix overlaps its match
        assert_eq!(copy_hint(&[3, 3, 3, 3], 4), (Some(3), 3));
    }

    #[test]
    fn indexed_hints_equal_the_scans() {
        let mut s = 12345u64;
        for case in 0..200 {
            let len = 1 + case % 60;
            let alphabet = 2 + (case % 5) as u64;
            let text: Vec<u32> = (0..len)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s % alphabet) as u32
                })
                .collect();
            for nmax in [1, 2, 4] {
                for m in [1, 3, 5, len / 2, len] {
                    let want: Vec<_> = (0..m.min(len)).map(|i| copy_hint(&text[..len - m.min(len) + i + 1], nmax)).collect();
                    assert_eq!(copy_hints(&text, m, nmax), want, "text {text:?}, m {m}, nmax {nmax}");
                }
            }
        }
    }
}
