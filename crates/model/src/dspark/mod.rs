//! A DSpark block drafter: a DFlash backbone fed by target hidden states from
//! several layers, plus a low-rank Markov head and a confidence head. The GGUF
//! layout is llama.cpp's `dflash` architecture (documented in
//! `docs/support-format.md`), so files convert both ways.
//!
//! ```text
//! context row p:  g_p = enc_norm(fc · [h_p^(l1); …; h_p^(lm)])        (m·d → d)
//!                 per backbone layer: K_p = rope(k_norm(wk·g_p)), V_p = wv·g_p
//! block at a:     x_i = emb(i == 0 ? anchor : mask), position a + i, i < B
//!                 backbone layers: q/k-normed, NeoX RoPE, attention over
//!                 [context 0..a ‖ block], non-causal inside the block, SwiGLU
//!                 (llama.cpp's options change this where a file has them:
//!                 [`Backbone`])
//!                 e_i = output_norm(x_i);  U_i = output · e_i  (draft vocab)
//! Markov chain:   w = w1[prev];  logits_i = U_i + w2 · w;
//!                 c_i = σ(conf · [e_i; w] + b);  prev = token_i   (prev_0 = anchor)
//! ```
//!
//! A file without the Markov head is a plain DFlash drafter: slots 1.. draft
//! the argmax of `U_i` (the anchor's slot never predicts), as in llama.cpp.
//!
//! Slot i predicts the token at position a + i + 1. `h^(l)` is the input of
//! target layer l (the output of layer l − 1), as in llama.cpp.

use std::sync::Arc;

use tandem_gguf::Gguf;
use tandem_kernels::matmul::{matmul, matmul_many};
use tandem_kernels::{ops, ThreadPool};

use crate::kv::KvCache;
use crate::support::{detect_kind, SupportError, SupportKind, TargetId};
use crate::transformer::resize;
use crate::weights::WeightRef;
use crate::{Model, ModelError};

pub mod format;
pub use format::*;
use format::{dequant, read_ids};

/// One loaded backbone block.
struct DLayer {
    attn_norm: Vec<f32>,
    wq: WeightRef,
    wk: WeightRef,
    /// None: values are the keys' projection, RMS-normed per head without a
    /// weight and not rotated (llama.cpp's shared K/V, Gemma 4's k_eq_v).
    wv: Option<WeightRef>,
    wo: WeightRef,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: WeightRef,
    up: WeightRef,
    down: WeightRef,
    /// Per-head softmax sinks (a logit with no value row).
    sinks: Option<Vec<f32>>,
    /// RMSNorm weights of the attention and FFN outputs before their residual adds.
    post_attn_norm: Option<Vec<f32>>,
    post_ffw_norm: Option<Vec<f32>>,
    /// Factor on the layer's output.
    out_scale: Option<f32>,
}

/// A loaded DSpark drafter bound to one target.
pub struct DSparkModel {
    gguf: Arc<Gguf>,
    target: Arc<Model>,
    pub cfg: DSparkConfig,
    fc: WeightRef,
    enc_norm: Vec<f32>,
    layers: Vec<DLayer>,
    output_norm: Vec<f32>,
    /// Own head (None: the target's, full vocabulary): `output.weight`, or
    /// else the file's `token_embd.weight` (tied).
    output: Option<WeightRef>,
    d2t: Option<Vec<u32>>,
    /// Target token → draft row (u32::MAX: none); built only for copy hints.
    t2d: Vec<u32>,
    /// The Markov head (None: a plain DFlash drafter).
    w1: Option<WeightRef>,
    w2: Option<WeightRef>,
    conf: Option<(Vec<f32>, f32)>,
    /// The block's token embeddings when the file has its own (else the target's).
    tok_embd: Option<WeightRef>,
    /// RoPE frequency divisors, `head_dim / 2` of them (`rope_freqs.weight`).
    rope_freqs: Option<Vec<f32>>,
    /// How llama.cpp runs this backbone (tandem's files: [`Backbone::PLAIN`]).
    pub backbone: Backbone,
    warnings: Vec<String>,
}

impl std::fmt::Debug for DSparkModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DSparkModel").field("cfg", &self.cfg).finish()
    }
}

/// Load a vector tensor of exactly `n` values.
fn load_vec_k(g: &Gguf, kind: SupportKind, name: &str, n: usize) -> Result<Vec<f32>, SupportError> {
    let Some(t) = g.tensor_info(name) else {
        return Err(SupportError::MissingTensor { kind, name: name.into() });
    };
    if t.dims != [n as u64] {
        return Err(SupportError::Tensor(kind, ModelError::BadShape { name: name.into(), got: t.dims.clone(), want: vec![n as u64] }));
    }
    crate::weights::load_vec(g, name, n).map_err(|e| SupportError::Tensor(kind, e))
}

/// Load a matrix tensor `[k, n]` (ggml order).
fn load_mat_k(g: &Gguf, kind: SupportKind, name: &str, k: usize, n: usize) -> Result<WeightRef, SupportError> {
    if g.tensor_info(name).is_none() {
        return Err(SupportError::MissingTensor { kind, name: name.into() });
    }
    WeightRef::load_packed(g, name, k, n).map_err(|e| SupportError::Tensor(kind, e))
}

impl DSparkModel {
    /// Validate `g` against `target` (identified by `id`) and load it.
    pub fn load(g: Arc<Gguf>, target: Arc<Model>, id: &TargetId) -> Result<Self, SupportError> {
        let kind = SupportKind::DSpark;
        let found = detect_kind(&g)?;
        if found != kind {
            return Err(SupportError::Metadata { kind, msg: format!("file holds an {found} head, not a DSpark drafter") });
        }
        let mut warnings: Vec<String> = id.check_or_derive(&g, kind)?.into_iter().collect();
        let tc = &target.cfg;
        let cfg = DSparkConfig::from_gguf(&g, tc)?;
        let meta = |msg: String| SupportError::Metadata { kind, msg };
        let d = cfg.d_model;
        for n in 0..cfg.n_layer {
            for t in BLOCK_TENSORS.iter().filter(|&&t| t != "attn_v.weight") {
                let name = format!("blk.{n}.{t}");
                if g.tensor_info(&name).is_none() {
                    return Err(SupportError::MissingTensor { kind, name });
                }
            }
        }
        let (backbone, w) = Backbone::from_gguf(&g, &cfg, tc)?;
        warnings.extend(w);
        let opt_vec = |name: &str, n: usize| -> Result<Option<Vec<f32>>, SupportError> {
            match g.tensor_info(name) {
                None => Ok(None),
                Some(_) => load_vec_k(&g, kind, name, n).map(Some),
            }
        };
        let fc = load_mat_k(&g, kind, "fc.weight", cfg.feat_dim(), d)?;
        let enc_norm = load_vec_k(&g, kind, "enc.output_norm.weight", d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for n in 0..cfg.n_layer {
            let p = |s: &str| format!("blk.{n}.{s}");
            let (qd, kvd, f, hd) = (cfg.q_dim(), cfg.kv_dim(), cfg.ffn, cfg.head_dim);
            layers.push(DLayer {
                attn_norm: load_vec_k(&g, kind, &p("attn_norm.weight"), d)?,
                wq: load_mat_k(&g, kind, &p("attn_q.weight"), d, qd)?,
                wk: load_mat_k(&g, kind, &p("attn_k.weight"), d, kvd)?,
                wv: match g.tensor_info(&p("attn_v.weight")) {
                    Some(_) => Some(load_mat_k(&g, kind, &p("attn_v.weight"), d, kvd)?),
                    None => None,
                },
                wo: load_mat_k(&g, kind, &p("attn_output.weight"), qd, d)?,
                q_norm: load_vec_k(&g, kind, &p("attn_q_norm.weight"), hd)?,
                k_norm: load_vec_k(&g, kind, &p("attn_k_norm.weight"), hd)?,
                ffn_norm: load_vec_k(&g, kind, &p("ffn_norm.weight"), d)?,
                gate: load_mat_k(&g, kind, &p("ffn_gate.weight"), d, f)?,
                up: load_mat_k(&g, kind, &p("ffn_up.weight"), d, f)?,
                down: load_mat_k(&g, kind, &p("ffn_down.weight"), f, d)?,
                sinks: opt_vec(&p("attn_sinks.weight"), cfg.n_head)?,
                post_attn_norm: opt_vec(&p("post_attention_norm.weight"), d)?,
                post_ffw_norm: opt_vec(&p("post_ffw_norm.weight"), d)?,
                out_scale: opt_vec(&p("layer_output_scale.weight"), 1)?.map(|v| v[0]),
            });
        }
        let output_norm = load_vec_k(&g, kind, "output_norm.weight", d)?;
        let d2t = match g.tensor("d2t") {
            Err(_) => None,
            Ok((t, data)) => {
                let ids = read_ids(t.ty, data).ok_or_else(|| SupportError::BadType {
                    kind,
                    name: "d2t".into(),
                    ty: t.ty.to_string(),
                    want: "I64 or I32",
                })?;
                if t.dims.len() != 1 {
                    return Err(meta(format!("d2t has shape {:?}", t.dims)));
                }
                if let Some(&bad) = ids.iter().find(|&&i| i < 0 || i as usize >= tc.vocab) {
                    return Err(meta(format!("d2t maps to token {bad} outside the vocabulary of {}", tc.vocab)));
                }
                let mut seen = vec![false; tc.vocab];
                for &i in &ids {
                    if std::mem::replace(&mut seen[i as usize], true) {
                        return Err(meta(format!("d2t maps two draft rows to token {i}")));
                    }
                }
                Some(ids.into_iter().map(|i| i as u32).collect::<Vec<u32>>())
            }
        };
        let tok_embd = match g.tensor_info("token_embd.weight") {
            Some(_) => Some(load_mat_k(&g, kind, "token_embd.weight", d, tc.vocab)?),
            None => None,
        };
        let output = if g.tensor_info("output.weight").is_some() {
            Some(load_mat_k(&g, kind, "output.weight", d, cfg.draft_vocab)?)
        } else if d2t.is_some() {
            return Err(SupportError::MissingTensor { kind, name: "output.weight (required with d2t)".into() });
        } else {
            // llama.cpp ties the head to the file's own embeddings when it has them
            tok_embd.clone()
        };
        let rope_freqs = opt_vec("rope_freqs.weight", cfg.head_dim / 2)?;
        if let Some(f) = &rope_freqs {
            if f.iter().any(|&x| x.is_nan() || x <= 0.0) {
                return Err(meta("rope_freqs.weight holds a value that is not positive".into()));
            }
        }
        let r = cfg.markov_rank;
        let (w1, w2) = if cfg.has_markov() {
            (
                Some(load_mat_k(&g, kind, "markov_w1.weight", r, tc.vocab)?),
                Some(load_mat_k(&g, kind, "markov_w2.weight", r, cfg.draft_vocab)?),
            )
        } else {
            (None, None)
        };
        let conf = if cfg.has_conf {
            let (t, _) = g.tensor("conf_proj.weight").map_err(|e| SupportError::Tensor(kind, e.into()))?;
            let want = [(d + r) as u64, 1];
            if t.dims != want && t.dims != [(d + r) as u64] {
                return Err(SupportError::Tensor(
                    kind,
                    ModelError::BadShape { name: "conf_proj.weight".into(), got: t.dims.clone(), want: want.to_vec() },
                ));
            }
            let w = dequant(&g, "conf_proj.weight", d + r).map_err(|e| SupportError::Tensor(kind, e))?;
            let b = if g.tensor_info("conf_proj.bias").is_some() { load_vec_k(&g, kind, "conf_proj.bias", 1)?[0] } else { 0.0 };
            Some((w, b))
        } else {
            None
        };
        let mut t2d = Vec::new();
        if cfg.copy_ngram() > 0 {
            t2d = vec![u32::MAX; tc.vocab];
            for r in 0..cfg.draft_vocab {
                t2d[d2t.as_ref().map_or(r, |v| v[r] as usize)] = r as u32;
            }
        }
        Ok(DSparkModel {
            gguf: g,
            target,
            cfg,
            fc,
            enc_norm,
            layers,
            output_norm,
            output,
            d2t,
            t2d,
            w1,
            w2,
            conf,
            tok_embd,
            rope_freqs,
            backbone,
            warnings,
        })
    }

    /// What loads but deserves a word: a file without tandem's binding keys,
    /// taps llama.cpp cannot extract. The drafter logs them.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The block's input embedding of `token` (the file's embeddings if it
    /// has them, else the target's), before `embedding_scale`.
    fn embed(&self, token: u32, out: &mut [f32]) -> Result<(), ModelError> {
        match &self.tok_embd {
            None => self.target.embed(token, out),
            Some(w) if (token as usize) < w.n => {
                w.view(&self.gguf).row_f32(token as usize, out);
                Ok(())
            }
            Some(w) => Err(ModelError::BadToken { id: token, vocab: w.n }),
        }
    }

    pub fn target(&self) -> &Arc<Model> {
        &self.target
    }

    pub fn has_confidence(&self) -> bool {
        self.conf.is_some()
    }

    /// Target token id of draft row `r`.
    pub fn to_target(&self, r: usize) -> u32 {
        self.d2t.as_ref().map_or(r as u32, |v| v[r])
    }

    /// A cache for the backbone (context rows + one block).
    pub fn new_cache(&self, ctx: usize) -> KvCache {
        KvCache::new(self.cfg.n_layer, self.cfg.kv_dim(), ctx.max(1) + self.cfg.block_size)
    }

    /// RoPE angles of positions `p0..p0 + rows`, `n_rot / 2` per row
    /// (computed once per call, shared by every layer and by q and k).
    /// As in ggml, angle j is `p · freq_scale · base^(−2j/n_rot) / f_j`
    /// with `f` the file's `rope_freqs` (1 without).
    fn rope_table(&self, p0: usize, rows: usize) -> Vec<(f32, f32)> {
        let n_rot = self.backbone.n_rot;
        let half = n_rot / 2;
        let (base, scale) = (self.cfg.rope_base, self.backbone.rope_freq_scale);
        let mut cs = vec![(0f32, 0f32); rows * half];
        for (i, row) in cs.chunks_exact_mut(half).enumerate() {
            match &self.rope_freqs {
                None => ops::rope_angles(p0 + i, n_rot, base, scale, row),
                Some(ff) => {
                    for (j, c) in row.iter_mut().enumerate() {
                        let inv = (base as f64).powf(-2.0 * j as f64 / n_rot as f64);
                        let th = (p0 + i) as f64 * inv * scale as f64 / ff[j] as f64;
                        *c = (th.cos() as f32, th.sin() as f32);
                    }
                }
            }
        }
        cs
    }

    /// NeoX RoPE on the leading `n_rot` dimensions of every head of one
    /// row, with that row's angles.
    fn rope_row(&self, x: &mut [f32], cs: &[(f32, f32)]) {
        let n_rot = self.backbone.n_rot;
        for h in x.chunks_exact_mut(self.cfg.head_dim) {
            ops::rope_halves(&mut h[..n_rot], cs);
        }
    }

    /// Values without `attn_v`: the keys' projection `k`, RMS-normed per
    /// head with no weight.
    fn shared_values(&self, k: &[f32], v: &mut [f32]) {
        let hd = self.cfg.head_dim;
        let ones = vec![1f32; hd];
        for (src, dst) in k.chunks_exact(hd).zip(v.chunks_exact_mut(hd)) {
            ops::rmsnorm(src, &ones, self.cfg.eps, dst);
        }
    }

    fn head_norm(x: &mut [f32], w: &[f32], eps: f32, hd: usize) {
        let mut tmp = vec![0f32; hd];
        for h in x.chunks_exact_mut(hd) {
            ops::rmsnorm(h, w, eps, &mut tmp);
            h.copy_from_slice(&tmp);
        }
    }

    /// Append context rows for positions `cache.len()..`: `feats` holds
    /// `rows × (m·d)` target features (taps concatenated in
    /// `target_layers` order).
    pub fn inject(&self, pool: &ThreadPool, cache: &mut KvCache, feats: &[f32], rows: usize) -> Result<(), ModelError> {
        let c = &self.cfg;
        let (d, fd, kvd) = (c.d_model, c.feat_dim(), c.kv_dim());
        if feats.len() != rows * fd {
            return Err(ModelError::BadConfig(format!("dspark: {} feature values for {rows} rows of {fd}", feats.len())));
        }
        if cache.len() + rows > cache.ctx() {
            return Err(ModelError::ContextFull { have: cache.len(), add: rows, ctx: cache.ctx() });
        }
        if rows == 0 {
            return Ok(());
        }
        let p0 = cache.len();
        let g = &self.gguf;
        let mut x = vec![0f32; rows * d];
        matmul(pool, &self.fc.view(g), feats, rows, &mut x);
        let mut gn = vec![0f32; rows * d];
        for i in 0..rows {
            ops::rmsnorm(&x[i * d..(i + 1) * d], &self.enc_norm, c.eps, &mut gn[i * d..(i + 1) * d]);
        }
        let mut k = vec![0f32; rows * kvd];
        let mut v = vec![0f32; rows * kvd];
        let cs = self.rope_table(p0, rows);
        let half = self.backbone.n_rot / 2;
        for (li, ly) in self.layers.iter().enumerate() {
            match &ly.wv {
                Some(wv) => matmul_many(pool, &[&ly.wk.view(g), &wv.view(g)], &gn, rows, &mut [&mut k, &mut v]),
                None => {
                    matmul(pool, &ly.wk.view(g), &gn, rows, &mut k);
                    self.shared_values(&k, &mut v);
                }
            }
            for i in 0..rows {
                let kr = &mut k[i * kvd..(i + 1) * kvd];
                Self::head_norm(kr, &ly.k_norm, c.eps, c.head_dim);
                self.rope_row(kr, &cs[i * half..(i + 1) * half]);
            }
            cache.push_layer(li, &k, &v);
        }
        cache.commit(rows);
        Ok(())
    }

    /// Run the backbone on a block of `n` slots (`n ≤ block_size`): slot 0 is
    /// `anchor` at position `cache.len()`, the others the mask token. Fills
    /// `e` (`n × d`, after the output norm) and `base` (`n × draft_vocab`).
    /// The cache is left as it was (block rows are dropped). `hint` is slot
    /// 0's copy hint ([`Self::copy_hint`] over the history and the anchor):
    /// with `copy_embed` its embedding, scaled, joins the anchor's.
    #[allow(clippy::too_many_arguments)]
    pub fn block(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        anchor: u32,
        hint: Option<(u32, usize)>,
        n: usize,
        e: &mut Vec<f32>,
        base: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let c = &self.cfg;
        let (d, qd, kvd, f, hd) = (c.d_model, c.q_dim(), c.kv_dim(), c.ffn, c.head_dim);
        if n == 0 || n > c.block_size {
            return Err(ModelError::BadConfig(format!("dspark: block of {n} slots (trained size {})", c.block_size)));
        }
        if cache.len() + n > cache.ctx() {
            return Err(ModelError::ContextFull { have: cache.len(), add: n, ctx: cache.ctx() });
        }
        let a = cache.len();
        let g = &self.gguf;
        let bb = &self.backbone;
        let mut x = vec![0f32; n * d];
        self.embed(anchor, &mut x[..d])?;
        if let (Some((t, k)), false) = (hint, c.copy_embed.is_empty()) {
            let s = c.copy_embed[k - 1];
            let mut he = vec![0f32; d];
            self.embed(t, &mut he)?;
            x[..d].iter_mut().zip(&he).for_each(|(a, b)| *a += s * b);
        }
        for i in 1..n {
            self.embed(c.mask_token, &mut x[i * d..(i + 1) * d])?;
        }
        if bb.embedding_scale != 0.0 {
            x.iter_mut().for_each(|v| *v *= bb.embedding_scale);
        }
        let mut tmp = vec![0f32; d];
        let post_norm = |y: &mut [f32], w: &[f32], tmp: &mut [f32]| {
            for row in y.chunks_exact_mut(d) {
                ops::rmsnorm(row, w, c.eps, tmp);
                row.copy_from_slice(tmp);
            }
        };
        let mut h = vec![0f32; n * d];
        let mut q = vec![0f32; n * qd];
        let mut k = vec![0f32; n * kvd];
        let mut v = vec![0f32; n * kvd];
        let mut att = vec![0f32; n * qd];
        let mut o = vec![0f32; n * d];
        let mut gt = vec![0f32; n * f];
        let mut up = vec![0f32; n * f];
        let cs = self.rope_table(a, n);
        let half = bb.n_rot / 2;
        for (li, ly) in self.layers.iter().enumerate() {
            for i in 0..n {
                ops::rmsnorm(&x[i * d..(i + 1) * d], &ly.attn_norm, c.eps, &mut h[i * d..(i + 1) * d]);
            }
            match &ly.wv {
                Some(wv) => {
                    matmul_many(pool, &[&ly.wq.view(g), &ly.wk.view(g), &wv.view(g)], &h, n, &mut [&mut q, &mut k, &mut v]);
                }
                None => {
                    matmul_many(pool, &[&ly.wq.view(g), &ly.wk.view(g)], &h, n, &mut [&mut q, &mut k]);
                    self.shared_values(&k, &mut v);
                }
            }
            for i in 0..n {
                let qr = &mut q[i * qd..(i + 1) * qd];
                Self::head_norm(qr, &ly.q_norm, c.eps, hd);
                self.rope_row(qr, &cs[i * half..(i + 1) * half]);
                let kr = &mut k[i * kvd..(i + 1) * kvd];
                Self::head_norm(kr, &ly.k_norm, c.eps, hd);
                self.rope_row(kr, &cs[i * half..(i + 1) * half]);
            }
            cache.push_layer(li, &k, &v);
            let mask = AttnMask {
                scale: if bb.attn_scale != 0.0 { bb.attn_scale } else { 1.0 / (hd as f32).sqrt() },
                causal: bb.causal,
                window: if bb.is_sliding(li) { bb.sliding_window } else { 0 },
                sinks: ly.sinks.as_deref(),
            };
            block_attention(pool, c, &mask, cache, li, a + n, n, &q, &mut att);
            matmul(pool, &ly.wo.view(g), &att, n, &mut o);
            if bb.value_scale != 0.0 {
                o.iter_mut().for_each(|v| *v *= bb.value_scale);
            }
            if let Some(w) = &ly.post_attn_norm {
                post_norm(&mut o, w, &mut tmp);
            }
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            for i in 0..n {
                ops::rmsnorm(&x[i * d..(i + 1) * d], &ly.ffn_norm, c.eps, &mut h[i * d..(i + 1) * d]);
            }
            matmul_many(pool, &[&ly.gate.view(g), &ly.up.view(g)], &h, n, &mut [&mut gt, &mut up]);
            match bb.activation {
                Activation::Silu => ops::silu_mul(&mut gt, &up),
                Activation::Gelu => ops::gelu_mul(&mut gt, &up),
            }
            matmul(pool, &ly.down.view(g), &gt, n, &mut o);
            if let Some(w) = &ly.post_ffw_norm {
                post_norm(&mut o, w, &mut tmp);
            }
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            if let Some(s) = ly.out_scale {
                x.iter_mut().for_each(|v| *v *= s);
            }
        }
        // the block's rows were pushed layer by layer without a commit: drop them
        cache.commit(n);
        cache.truncate(a);
        let e = resize(e, n * d);
        for i in 0..n {
            ops::rmsnorm(&x[i * d..(i + 1) * d], &self.output_norm, c.eps, &mut e[i * d..(i + 1) * d]);
        }
        match &self.output {
            Some(w) => {
                base.resize(n * w.n, 0.0);
                matmul(pool, &w.view(g), e, n, base);
            }
            // llama.cpp applies no soft-cap to a drafter's logits, so a
            // soft-capped target's head is used raw
            None if self.target.cfg.logit_softcap.is_some() => {
                let w = self.target.output_weight();
                base.resize(n * w.n, 0.0);
                matmul(pool, &w.view(self.target.gguf()), e, n, base);
            }
            None => self.target.lm_head(pool, e, n, base),
        }
        Ok(())
    }

    /// The copy hint of the slot whose Markov input is the last token of
    /// `text` (the history, the anchor and the drafts before the slot):
    /// `(target token, suffix length)`, or None without hints or without an
    /// earlier occurrence.
    pub fn copy_hint(&self, text: &[u32]) -> Option<(u32, usize)> {
        match crate::mtp::copy_hint(text, self.cfg.copy_ngram()) {
            (Some(t), n) if n > 0 => Some((t, n)),
            _ => None,
        }
    }

    /// One Markov step: add `w2 · w1[prev]` to `logits` (a slot's base
    /// logits, draft vocabulary) and return the slot's confidence
    /// σ(conf · [e; w1[prev]] + b) (None without a confidence head):
    /// [`Self::markov_input`], [`Self::markov_confidence`] and then
    /// [`Self::markov_logits`].
    pub fn markov(
        &self,
        pool: &ThreadPool,
        prev: u32,
        hint: Option<(u32, usize)>,
        e: &[f32],
        logits: &mut Vec<f32>,
    ) -> Result<Option<f32>, ModelError> {
        let m = self.markov_input(prev, hint)?;
        let c = self.markov_confidence(&m, e);
        self.markov_logits(pool, &m, e, logits)?;
        Ok(c)
    }

    /// What a slot's Markov step reads, checked once: `w1[prev]` and the
    /// slot's copy hint (see [`Self::copy_hint`]).
    pub fn markov_input(&self, prev: u32, hint: Option<(u32, usize)>) -> Result<MarkovInput, ModelError> {
        let c = &self.cfg;
        if prev as usize >= self.target.cfg.vocab {
            return Err(ModelError::BadToken { id: prev, vocab: self.target.cfg.vocab });
        }
        if let Some((tok, n)) = hint {
            if tok as usize >= self.target.cfg.vocab || n == 0 || n > c.copy_ngram() {
                return Err(ModelError::BadConfig(format!("dspark: copy hint (token {tok}, length {n}) out of range")));
            }
        }
        let mut w1 = vec![0f32; c.markov_rank];
        if let Some(m) = &self.w1 {
            m.view(&self.gguf).row_f32(prev as usize, &mut w1);
        }
        Ok(MarkovInput { w1, hint })
    }

    /// A slot's confidence σ(conf · [e; w1[prev]] + b), plus
    /// `copy_conf_bias[n − 1]` with a copy hint of length n (None without a
    /// confidence head). It needs only `w1`'s row, so a drafter can decide
    /// whether to continue before it pays for the slot's logits.
    pub fn markov_confidence(&self, m: &MarkovInput, e: &[f32]) -> Option<f32> {
        let c = &self.cfg;
        let (cw, cb) = self.conf.as_ref()?;
        let hz = m.hint.map_or(0.0, |(_, n)| c.copy_conf_bias[n - 1]);
        let z = ops::dot_f32(&cw[..c.d_model], e) + ops::dot_f32(&cw[c.d_model..], &m.w1) + cb + hz;
        Some(1.0 / (1.0 + (-z).exp()))
    }

    /// A slot's Markov-corrected logits: add `w2 · w1[prev]` to `logits` (its
    /// base logits over the draft vocabulary).
    ///
    /// With a copy hint, `copy_bias[n − 1]` goes on the hinted token's row; a
    /// hinted token outside the draft vocabulary gets a logit of its own
    /// appended after the draft rows (the target head's row for it · e, plus
    /// the bias), so `logits[draft_vocab]` then stands for it.
    pub fn markov_logits(&self, pool: &ThreadPool, m: &MarkovInput, e: &[f32], logits: &mut Vec<f32>) -> Result<(), ModelError> {
        let c = &self.cfg;
        if let Some(w2) = &self.w2 {
            let mut bias = vec![0f32; c.draft_vocab];
            matmul(pool, &w2.view(&self.gguf), &m.w1, 1, &mut bias);
            logits.iter_mut().zip(&bias).for_each(|(l, b)| *l += b);
        }
        if let Some((tok, n)) = m.hint {
            let b = c.copy_bias[n - 1];
            match self.t2d[tok as usize] {
                u32::MAX => {
                    let w = self.target.output_weight().gather_rows(self.target.gguf(), &[tok], "dspark.hint_row")?;
                    let mut l = vec![0f32; 1];
                    matmul(pool, &w.view(self.target.gguf()), e, 1, &mut l);
                    logits.truncate(c.draft_vocab);
                    logits.push(l[0] + b);
                }
                row => logits[row as usize] += b,
            }
        }
        Ok(())
    }
}

/// A slot's Markov input, from [`DSparkModel::markov_input`].
pub struct MarkovInput {
    w1: Vec<f32>,
    hint: Option<(u32, usize)>,
}

/// Which keys a block row sees, and how its scores are weighed.
struct AttnMask<'a> {
    scale: f32,
    /// Block row i sees block rows ≤ i only.
    causal: bool,
    /// A row at position p sees keys at positions > p − window (0: all).
    window: usize,
    /// Per-head sink logits, in the softmax's denominator only.
    sinks: Option<&'a [f32]>,
}

/// Attention of `n` block rows over cache rows `0..n_ctx` (the context and
/// the whole block; cache row r holds position r). Without a causal mask or
/// a window every row sees all of them; with them each row's visible keys
/// are still one contiguous range.
#[allow(clippy::too_many_arguments)]
fn block_attention(
    pool: &ThreadPool,
    c: &DSparkConfig,
    mask: &AttnMask,
    cache: &KvCache,
    layer: usize,
    n_ctx: usize,
    n: usize,
    q: &[f32],
    out: &mut [f32],
) {
    let (kc, vc) = cache.layer(layer);
    let (hd, kvd, qd) = (c.head_dim, c.kv_dim(), c.q_dim());
    let group = c.n_head / c.n_kv_head;
    let scale = mask.scale;
    // unit u is head u % n_head of row u / n_head: the pieces in order
    pool.run_pieces(
        &mut out[..n * qd],
        hd,
        |u| u,
        || vec![0f32; n_ctx],
        |sc, u, o| {
            let (i, h) = (u / c.n_head, u % c.n_head);
            let kvh = h / group;
            let qh = &q[i * qd + h * hd..i * qd + (h + 1) * hd];
            let pos = n_ctx - n + i;
            let hi = if mask.causal { pos + 1 } else { n_ctx };
            let lo = if mask.window > 0 { (pos + 1).saturating_sub(mask.window) } else { 0 };
            let sc = &mut sc[..hi - lo];
            let (kc, vc) = (&kc[lo * kvd..], &vc[lo * kvd..]);
            // key and value head kvh of rows lo..hi, in order (see llama's attention)
            ops::dot_rows(qh, kc, kvd, kvh * hd, scale, sc);
            match mask.sinks {
                None => {
                    ops::softmax_inplace(sc);
                }
                Some(sinks) => {
                    let s = sinks[h];
                    let m = sc.iter().copied().fold(s, f32::max);
                    ops::exp_sub_inplace(sc, m);
                    let inv = 1.0 / (ops::sum_f32(sc) + (s - m).exp());
                    sc.iter_mut().for_each(|v| *v *= inv);
                }
            }
            o.iter_mut().for_each(|v| *v = 0.0);
            ops::axpy_rows(o, sc, vc, kvd, kvh * hd);
        },
    );
}
