//! The decoder-only transformer forward pass: the llama family (SmolLM2,
//! Llama-3, Mistral, Qwen2) and Gemma 3, whose blocks add Q/K norms, norms
//! after attention and feed-forward, GeGLU, scaled embeddings and local
//! layers that attend over a sliding window with their own RoPE base.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use tandem_gguf::Gguf;
use tandem_kernels::matmul::{matmul, matmul_many};
use tandem_kernels::ops;
use tandem_kernels::ThreadPool;

use crate::config::{Activation, Config, RopeStyle};
use crate::kv::{KvCache, KvType};
use crate::shard::{gather_columns, Collective, Frame, FrameSeg, Layout};
use crate::weights::{load_opt_vec, load_vec, WeightRef};
use crate::ModelError;

/// One transformer block's weights (attention + gated feed-forward).
pub(crate) struct Layer {
    /// Attends over a sliding window, with the local RoPE base.
    local: bool,
    attn_norm: Vec<f32>,
    /// Per-head RMS norms of queries and keys, before RoPE (gemma3).
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// RMS norms of the attention and feed-forward outputs before they join
    /// the residual stream (gemma3).
    post_attn_norm: Option<Vec<f32>>,
    post_ffn_norm: Option<Vec<f32>>,
    wq: WeightRef,
    wk: WeightRef,
    wv: WeightRef,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    wo: WeightRef,
    ffn_norm: Vec<f32>,
    w_gate: WeightRef,
    w_up: WeightRef,
    w_down: WeightRef,
}

impl Layer {
    /// Load block `prefix` (e.g. `blk.3`) with the shapes `cfg` implies;
    /// `local`: a sliding-window layer.
    pub(crate) fn load(g: &Gguf, cfg: &Config, prefix: &str, local: bool) -> Result<Self, ModelError> {
        Self::load_with(g, cfg, prefix, local, WeightRef::load_packed_rows, &Share::all(cfg))
    }

    /// [`load`](Self::load) with the matrices loaded by `load_matrix`,
    /// holding the rows `share` names.
    fn load_with(g: &Gguf, cfg: &Config, prefix: &str, local: bool, load_matrix: LoadMatrix, share: &Share) -> Result<Self, ModelError> {
        let (d, qd, kvd, f) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim(), cfg.ffn);
        let n = |s: &str| format!("{prefix}.{s}");
        let part = |v: Option<Vec<f32>>, r: &Range<usize>| v.map(|v| v[r.clone()].to_vec());
        Ok(Layer {
            local,
            attn_norm: load_vec(g, &n("attn_norm.weight"), d)?,
            q_norm: load_opt_vec(g, &n("attn_q_norm.weight"), cfg.head_dim)?,
            k_norm: load_opt_vec(g, &n("attn_k_norm.weight"), cfg.head_dim)?,
            post_attn_norm: load_opt_vec(g, &n("post_attention_norm.weight"), d)?,
            post_ffn_norm: load_opt_vec(g, &n("post_ffw_norm.weight"), d)?,
            wq: load_matrix(g, &n("attn_q.weight"), d, qd, share.q.clone())?,
            wk: load_matrix(g, &n("attn_k.weight"), d, kvd, share.kv.clone())?,
            wv: load_matrix(g, &n("attn_v.weight"), d, kvd, share.kv.clone())?,
            bq: part(load_opt_vec(g, &n("attn_q.bias"), qd)?, &share.q),
            bk: part(load_opt_vec(g, &n("attn_k.bias"), kvd)?, &share.kv),
            bv: part(load_opt_vec(g, &n("attn_v.bias"), kvd)?, &share.kv),
            wo: load_matrix(g, &n("attn_output.weight"), qd, d, share.d.clone())?,
            ffn_norm: load_vec(g, &n("ffn_norm.weight"), d)?,
            w_gate: load_matrix(g, &n("ffn_gate.weight"), d, f, share.ffn.clone())?,
            w_up: load_matrix(g, &n("ffn_up.weight"), d, f, share.ffn.clone())?,
            w_down: load_matrix(g, &n("ffn_down.weight"), f, d, share.d.clone())?,
        })
    }

    /// Run the block on the `m` residual rows in `s.x` (RoPE angles already in
    /// `s.cs`, and in `s.cs_local` for a local layer), appending their K/V
    /// rows to layer `li` of the cache(s) in `kv`. With `dist`, this rank
    /// computes its share of the columns and gathers the rest.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        pool: &ThreadPool,
        g: &Gguf,
        cfg: &Config,
        kv: &mut Kv,
        li: usize,
        m: usize,
        s: &mut Scratch,
        dist: Option<&Dist>,
    ) -> Result<(), ModelError> {
        let ly = self;
        let (d, qd_all, f_all) = (cfg.d_model, cfg.q_dim(), cfg.ffn);
        // this rank's widths (all of them without tensor parallelism)
        let (qd, kvd, d_own, f) = (ly.wq.n, ly.wk.n, ly.wo.n, ly.w_gate.n);
        let hd = cfg.head_dim;
        let half = cfg.rope_dim / 2;
        // --- attention ---
        let h = resize(&mut s.h, m * d);
        for i in 0..m {
            ops::rmsnorm(&s.x[i * d..(i + 1) * d], &ly.attn_norm, cfg.eps, &mut h[i * d..(i + 1) * d]);
        }
        let q = resize(&mut s.q, m * qd);
        let k = resize(&mut s.k, m * kvd);
        let v = resize(&mut s.v, m * kvd);
        matmul_many(pool, &[&ly.wq.view(g), &ly.wk.view(g), &ly.wv.view(g)], h, m, &mut [q, k, v]);
        for (buf, bias, width) in [(&mut s.q, &ly.bq, qd), (&mut s.k, &ly.bk, kvd), (&mut s.v, &ly.bv, kvd)] {
            if let Some(b) = bias {
                for row in buf[..m * width].chunks_exact_mut(width) {
                    row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                }
            }
        }
        for (buf, norm, width) in [(&mut s.q, &ly.q_norm, qd), (&mut s.k, &ly.k_norm, kvd)] {
            if let Some(w) = norm {
                let t = resize(&mut s.head, hd);
                for head in buf[..m * width].chunks_exact_mut(hd) {
                    t.copy_from_slice(head);
                    ops::rmsnorm(t, w, cfg.eps, head);
                }
            }
        }
        let cs_all = if ly.local { &s.cs_local } else { &s.cs };
        for i in 0..m {
            let cs = &cs_all[i * half..(i + 1) * half];
            for hq in s.q[i * qd..(i + 1) * qd].chunks_exact_mut(hd) {
                rope(cfg.rope_style, &mut hq[..cfg.rope_dim], cs);
            }
            for hk in s.k[i * kvd..(i + 1) * kvd].chunks_exact_mut(hd) {
                rope(cfg.rope_style, &mut hk[..cfg.rope_dim], cs);
            }
        }
        match kv {
            Kv::One(cache) => cache.push_layer(li, &s.k[..m * kvd], &s.v[..m * kvd]),
            Kv::Segs { caches, starts } => {
                for (j, cache) in caches.iter_mut().enumerate() {
                    let (a, b) = (starts[j] * kvd, starts[j + 1] * kvd);
                    cache.push_layer(li, &s.k[a..b], &s.v[a..b]);
                }
            }
        }
        let att = resize(&mut s.att, m * qd);
        attention(pool, dist.map_or(cfg, |t| &t.att_cfg), kv, li, m, &s.q[..m * qd], att);
        if let Some(t) = dist.filter(|t| t.layout.heads_split) {
            let full = resize(&mut s.gathered, m * qd_all);
            gather_columns(&*t.comm, &s.att[..m * qd], m, &t.q_widths, &mut s.tmp, full)?;
            std::mem::swap(&mut s.att, &mut s.gathered);
        }
        let o = resize(&mut s.o, m * d_own);
        matmul(pool, &ly.wo.view(g), &s.att[..m * qd_all], m, o);
        gather(dist, &mut s.o, &mut s.gathered, &mut s.tmp, m, |t| &t.d_widths)?;
        add_residual(cfg, &mut s.x[..m * d], &mut s.o[..m * d], &ly.post_attn_norm, &mut s.h);

        // --- feed-forward ---
        let h = resize(&mut s.h, m * d);
        for i in 0..m {
            ops::rmsnorm(&s.x[i * d..(i + 1) * d], &ly.ffn_norm, cfg.eps, &mut h[i * d..(i + 1) * d]);
        }
        let gt = resize(&mut s.g, m * f);
        let up = resize(&mut s.u, m * f);
        matmul_many(pool, &[&ly.w_gate.view(g), &ly.w_up.view(g)], h, m, &mut [gt, up]);
        match cfg.act {
            Activation::SwiGlu => ops::silu_mul(&mut s.g[..m * f], &s.u[..m * f]),
            Activation::GeGlu => ops::gelu_mul(&mut s.g[..m * f], &s.u[..m * f]),
        }
        gather(dist, &mut s.g, &mut s.gathered, &mut s.tmp, m, |t| &t.f_widths)?;
        let o = resize(&mut s.o, m * d_own);
        matmul(pool, &ly.w_down.view(g), &s.g[..m * f_all], m, o);
        gather(dist, &mut s.o, &mut s.gathered, &mut s.tmp, m, |t| &t.d_widths)?;
        add_residual(cfg, &mut s.x[..m * d], &mut s.o[..m * d], &ly.post_ffn_norm, &mut s.h);
        Ok(())
    }
}

/// With `dist`, replace the `m` rows of this rank's columns in `buf` by the
/// rows of all ranks' columns (widths from `widths`); without, nothing.
fn gather(
    dist: Option<&Dist>,
    buf: &mut Vec<f32>,
    spare: &mut Vec<f32>,
    tmp: &mut Vec<f32>,
    m: usize,
    widths: impl Fn(&Dist) -> &Vec<usize>,
) -> Result<(), ModelError> {
    let Some(t) = dist else { return Ok(()) };
    let w = widths(t);
    let own = w[t.layout.rank];
    let full = resize(spare, m * w.iter().sum::<usize>());
    gather_columns(&*t.comm, &buf[..m * own], m, w, tmp, full)?;
    std::mem::swap(buf, spare);
    Ok(())
}

/// The rows of each split matrix one process holds: query, key/value,
/// residual-width and feed-forward rows (all of them in one process).
#[derive(Debug, Clone)]
pub(crate) struct Share {
    q: Range<usize>,
    kv: Range<usize>,
    d: Range<usize>,
    ffn: Range<usize>,
}

impl Share {
    fn all(cfg: &Config) -> Share {
        Share { q: 0..cfg.q_dim(), kv: 0..cfg.kv_dim(), d: 0..cfg.d_model, ffn: 0..cfg.ffn }
    }

    fn of(cfg: &Config, l: &Layout, r: usize) -> Share {
        let (hd, group) = (cfg.head_dim, cfg.n_head / cfg.n_kv_head);
        let h = &l.kv_heads[r];
        Share { q: h.start * group * hd..h.end * group * hd, kv: h.start * hd..h.end * hd, d: l.d[r].clone(), ffn: l.ffn[r].clone() }
    }
}

/// A model split over ranks: the collectives, what each rank holds, and
/// the shape attention sees on this rank (its own heads).
pub(crate) struct Dist {
    comm: Arc<dyn Collective>,
    layout: Layout,
    att_cfg: Config,
    /// Per rank: query columns, residual columns, feed-forward columns,
    /// vocabulary rows.
    q_widths: Vec<usize>,
    d_widths: Vec<usize>,
    f_widths: Vec<usize>,
    v_widths: Vec<usize>,
}

/// `x += o` row by row, with `o` first RMS-normed by `post_norm` where the
/// block has one (`tmp`: scratch).
fn add_residual(cfg: &Config, x: &mut [f32], o: &mut [f32], post_norm: &Option<Vec<f32>>, tmp: &mut Vec<f32>) {
    let d = cfg.d_model;
    if let Some(w) = post_norm {
        let t = resize(tmp, d);
        for row in o.chunks_exact_mut(d) {
            t.copy_from_slice(row);
            ops::rmsnorm(t, w, cfg.eps, row);
        }
    }
    x.iter_mut().zip(o.iter()).for_each(|(a, b)| *a += b);
}

/// How a matrix (or the given rows of it) is loaded: packed for the
/// kernels, or dequantized.
type LoadMatrix = fn(&Gguf, &str, usize, usize, Range<usize>) -> Result<WeightRef, ModelError>;

/// A loaded model. Weights stay in the GGUF map; only norms and biases are copied.
pub struct Model {
    pub cfg: Config,
    gguf: Arc<Gguf>,
    tok_embd: WeightRef,
    output: WeightRef,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    /// Tensor parallelism: this rank's share and the collectives.
    dist: Option<Dist>,
    /// The whole output head, for drafters on the leader of a split model
    /// (loaded at first use).
    full_head: std::sync::OnceLock<WeightRef>,
    /// How new caches keep their K/V rows (0: f32, 1: f16; see
    /// [`set_kv_type`](Model::set_kv_type)).
    kv_type: std::sync::atomic::AtomicU8,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("cfg", &self.cfg).finish()
    }
}

/// Which rows of the batch get logits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogitRows {
    None,
    Last,
    All,
    /// These row indices (within the batch), in this order.
    Rows(Vec<usize>),
}

/// Where to capture hidden states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenTap {
    /// The residual stream after block `l` (0-based).
    Layer(usize),
    /// After the final norm (what the output head sees).
    Final,
}

/// Results of one forward call.
#[derive(Debug, Default, Clone)]
pub struct ForwardOutput {
    /// Batch rows that have logits, in order.
    pub rows: Vec<usize>,
    /// `rows.len() × vocab` logits.
    pub logits: Vec<f32>,
    /// One `m × d_model` matrix per requested tap, in request order.
    pub hidden: Vec<Vec<f32>>,
}

impl ForwardOutput {
    pub fn logits_row(&self, i: usize) -> &[f32] {
        let v = self.logits.len() / self.rows.len().max(1);
        &self.logits[i * v..(i + 1) * v]
    }
}

/// Scratch buffers reused across calls on the same thread.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) x: Vec<f32>,
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    o: Vec<f32>,
    g: Vec<f32>,
    u: Vec<f32>,
    head: Vec<f32>,
    /// Columns of all ranks, and the all-gather's buffer (tensor parallelism).
    gathered: Vec<f32>,
    tmp: Vec<f32>,
    pub(crate) cs: Vec<(f32, f32)>,
    /// RoPE angles of the local layers (their own base).
    pub(crate) cs_local: Vec<(f32, f32)>,
}

thread_local! {
    pub(crate) static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Per-head results of a batch of rows, before they go to their rows.
    static HEAD_ROWS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Widest batch of one sequence's rows attended head by head with shared
/// key and value blocks (a verify pass); wider ones (a prompt) are split by
/// (row, head), which balances the threads better.
const ROW_BATCH_MAX: usize = 64;
/// Cached positions from which a decode step attends by key/value head
/// even where the groups split unevenly over the threads (see `attention`).
const GROUP_SPAN_MIN: usize = 1536;
/// Cached positions per block: a block's keys or values of one head (64 ×
/// head size floats) stay in L1 while every row of the batch uses them.
const POS_BLOCK: usize = 64;

pub(crate) fn resize(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    v.resize(n, 0.0);
    &mut v[..n]
}

impl Model {
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Self, ModelError> {
        Self::from_gguf(Arc::new(Gguf::open(path)?))
    }

    pub fn from_gguf(g: Arc<Gguf>) -> Result<Self, ModelError> {
        Self::from_gguf_with(g, WeightRef::load_packed_rows, None)
    }

    /// This rank's share of the model for tensor parallelism over `comm`'s
    /// ranks (see [`crate::shard`]): rank 0 calls the forward passes, the
    /// others [`follow`](Self::follow). Every logit has the bits of the
    /// whole model in one process.
    pub fn from_gguf_shard(g: Arc<Gguf>, comm: Arc<dyn Collective>) -> Result<Self, ModelError> {
        Self::from_gguf_with(g, WeightRef::load_packed_rows, Some(comm))
    }

    /// Whether this model is one rank's share of a split model.
    pub fn is_split(&self) -> bool {
        self.dist.is_some()
    }

    /// The model with every matrix dequantized to f32 and activations never
    /// quantized: what the file's weights compute without the rounding of
    /// int8 activations. Several times slower and larger; a reference for
    /// checking numbers against other engines.
    pub fn from_gguf_f32(g: Arc<Gguf>) -> Result<Self, ModelError> {
        fn whole(g: &Gguf, name: &str, k: usize, n: usize, _rows: Range<usize>) -> Result<WeightRef, ModelError> {
            WeightRef::load_f32(g, name, k, n)
        }
        Self::from_gguf_with(g, whole, None)
    }

    fn from_gguf_with(g: Arc<Gguf>, load_matrix: LoadMatrix, comm: Option<Arc<dyn Collective>>) -> Result<Self, ModelError> {
        let cfg = Config::from_gguf(&g)?;
        let d = cfg.d_model;
        let dist = match comm {
            Some(comm) if comm.size() > 1 => {
                let layout = Layout::new(comm.rank(), comm.size(), cfg.n_kv_head, d, cfg.ffn, cfg.vocab)?;
                let shares: Vec<Share> = (0..layout.size).map(|r| Share::of(&cfg, &layout, r)).collect();
                let own = &shares[layout.rank];
                let mut att_cfg = cfg.clone();
                att_cfg.n_kv_head = layout.kv_heads[layout.rank].len();
                att_cfg.n_head = own.q.len() / cfg.head_dim;
                Some(Dist {
                    q_widths: shares.iter().map(|s| s.q.len()).collect(),
                    d_widths: shares.iter().map(|s| s.d.len()).collect(),
                    f_widths: shares.iter().map(|s| s.ffn.len()).collect(),
                    v_widths: layout.vocab.iter().map(|r| r.len()).collect(),
                    comm,
                    layout,
                    att_cfg,
                })
            }
            _ => None,
        };
        let share = match &dist {
            Some(t) => Share::of(&cfg, &t.layout, t.layout.rank),
            None => Share::all(&cfg),
        };
        let vocab_rows = dist.as_ref().map_or(0..cfg.vocab, |t| t.layout.vocab[t.layout.rank].clone());
        // an embedding table that is only looked up stays in the map, so only
        // the rows of tokens seen are ever resident; a tied one is also the
        // output head and is packed for it
        // (split: each rank packs its vocabulary rows of the head, and looks
        // embedding rows up in the map)
        let tied = g.tensor_info("output.weight").is_none();
        let tok_embd = if tied && dist.is_none() {
            load_matrix(&g, "token_embd.weight", d, cfg.vocab, 0..cfg.vocab)?
        } else {
            WeightRef::load(&g, "token_embd.weight", d, cfg.vocab)?
        };
        let output = match (tied, &dist) {
            (true, None) => tok_embd.clone(),
            (true, Some(_)) => load_matrix(&g, "token_embd.weight", d, cfg.vocab, vocab_rows)?,
            (false, _) => load_matrix(&g, "output.weight", d, cfg.vocab, vocab_rows)?,
        };
        let output_norm = load_vec(&g, "output_norm.weight", d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            layers.push(Layer::load_with(&g, &cfg, &format!("blk.{i}"), cfg.layer_window(i).is_some(), load_matrix, &share)?);
        }
        Ok(Model {
            cfg,
            gguf: g,
            tok_embd,
            output,
            output_norm,
            layers,
            dist,
            full_head: std::sync::OnceLock::new(),
            kv_type: Default::default(),
        })
    }

    pub fn gguf(&self) -> &Arc<Gguf> {
        &self.gguf
    }

    /// The final norm's weights (what the output head's input is scaled by).
    pub fn output_norm(&self) -> &[f32] {
        &self.output_norm
    }

    /// The output head's weight (the token embedding when tied); on a
    /// split model, the whole head, loaded for the leader's drafters.
    pub fn output_weight(&self) -> &WeightRef {
        match &self.dist {
            None => &self.output,
            Some(_) => self.full_head.get_or_init(|| {
                let name = if self.gguf.tensor_info("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
                WeightRef::load_packed(&self.gguf, name, self.cfg.d_model, self.cfg.vocab).expect("validated at load")
            }),
        }
    }

    /// Width of the K/V rows this process keeps per layer (its heads' share
    /// on a split model).
    fn kv_dim_here(&self) -> usize {
        self.dist.as_ref().map_or(self.cfg.kv_dim(), |t| t.att_cfg.kv_dim())
    }

    /// A fresh KV cache for up to `ctx` positions (clamped to the training
    /// context); local layers hold rings of their window.
    pub fn new_cache(&self, ctx: usize) -> KvCache {
        let windows: Vec<Option<usize>> = (0..self.cfg.n_layer).map(|l| self.cfg.layer_window(l)).collect();
        KvCache::with_windows(self.kv_dim_here(), ctx.clamp(1, self.cfg.ctx_train.max(1)), &windows, self.kv_type())
    }

    /// How caches made from now on keep their K/V rows (caches already
    /// made keep theirs). Every rank of a split model must be given the
    /// same type.
    pub fn set_kv_type(&self, ty: KvType) {
        self.kv_type.store(matches!(ty, KvType::F16) as u8, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn kv_type(&self) -> KvType {
        match self.kv_type.load(std::sync::atomic::Ordering::Relaxed) {
            0 => KvType::F32,
            _ => KvType::F16,
        }
    }

    /// Bytes of K/V rows a sequence holds with all `ctx` positions filled by
    /// forward passes of at most `widest` rows (sliding-window layers hold
    /// their rings, the others every position).
    pub fn kv_bytes_full(&self, ctx: usize, widest: usize) -> usize {
        let rows: usize = (0..self.cfg.n_layer)
            .map(|l| match self.cfg.layer_window(l) {
                Some(w) => KvCache::ring_rows(w, ctx, widest),
                None => ctx,
            })
            .sum();
        2 * rows * self.kv_dim_here() * self.kv_type().bytes()
    }

    /// Token embedding row (dequantized).
    pub fn embed(&self, token: u32, out: &mut [f32]) -> Result<(), ModelError> {
        if token as usize >= self.cfg.vocab {
            return Err(ModelError::BadToken { id: token, vocab: self.cfg.vocab });
        }
        self.tok_embd.view(&self.gguf).row_f32(token as usize, out);
        Ok(())
    }

    /// The output head applied to `m` rows that are already final-normed
    /// (with the model's logit soft-cap, if it has one).
    pub fn lm_head(&self, pool: &ThreadPool, x: &[f32], m: usize, logits: &mut Vec<f32>) {
        logits.resize(m * self.cfg.vocab, 0.0);
        matmul(pool, &self.output_weight().view(&self.gguf), &x[..m * self.cfg.d_model], m, logits);
        self.softcap(logits);
    }

    fn softcap(&self, logits: &mut [f32]) {
        if let Some(cap) = self.cfg.logit_softcap {
            logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
        }
    }

    /// The final norm of one row.
    pub fn final_norm(&self, x: &[f32], out: &mut [f32]) {
        ops::rmsnorm(x, &self.output_norm, self.cfg.eps, out);
    }

    /// Token ids within the vocabulary and layer taps within the model.
    fn check_inputs(&self, tokens: &[u32], taps: &[HiddenTap]) -> Result<(), ModelError> {
        let cfg = &self.cfg;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Err(ModelError::BadToken { id: t, vocab: cfg.vocab });
        }
        for tap in taps {
            if let HiddenTap::Layer(l) = *tap {
                if l >= cfg.n_layer {
                    return Err(ModelError::BadTap { layer: l, n_layer: cfg.n_layer });
                }
            }
        }
        Ok(())
    }

    /// Embedding rows of `tokens` into `s.x`.
    fn embed_rows(&self, tokens: &[u32], s: &mut Scratch) {
        let d = self.cfg.d_model;
        let x = resize(&mut s.x, tokens.len() * d);
        let emb = self.tok_embd.view(&self.gguf);
        for (i, &t) in tokens.iter().enumerate() {
            emb.row_f32(t as usize, &mut x[i * d..(i + 1) * d]);
        }
        if self.cfg.embed_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= self.cfg.embed_scale);
        }
    }

    /// All blocks over the `m` rows in `s.x`, capturing the layer taps asked for.
    fn run_layers(
        &self,
        pool: &ThreadPool,
        kv: &mut Kv,
        m: usize,
        taps: &[HiddenTap],
        s: &mut Scratch,
        out: &mut ForwardOutput,
    ) -> Result<(), ModelError> {
        let d = self.cfg.d_model;
        for (li, ly) in self.layers.iter().enumerate() {
            ly.forward(pool, &self.gguf, &self.cfg, kv, li, m, s, self.dist.as_ref())?;
            for (ti, tap) in taps.iter().enumerate() {
                if *tap == HiddenTap::Layer(li) {
                    out.hidden[ti] = s.x[..m * d].to_vec();
                }
            }
        }
        Ok(())
    }

    /// After the blocks: the final norm of the rows that need it (those
    /// given logits, or all with a `Final` tap), the `Final` taps, and the
    /// logits of `out.rows`.
    fn output_rows(
        &self,
        pool: &ThreadPool,
        m: usize,
        taps: &[HiddenTap],
        s: &mut Scratch,
        out: &mut ForwardOutput,
    ) -> Result<(), ModelError> {
        let d = self.cfg.d_model;
        let need_final = taps.contains(&HiddenTap::Final);
        let h = resize(&mut s.h, m * d);
        for i in 0..m {
            if need_final || out.rows.contains(&i) {
                self.final_norm(&s.x[i * d..(i + 1) * d], &mut h[i * d..(i + 1) * d]);
            }
        }
        for (ti, tap) in taps.iter().enumerate() {
            if *tap == HiddenTap::Final {
                out.hidden[ti] = h.to_vec();
            }
        }
        let nr = out.rows.len();
        if nr > 0 {
            let sel = resize(&mut s.o, nr * d);
            for (j, &r) in out.rows.iter().enumerate() {
                sel[j * d..(j + 1) * d].copy_from_slice(&h[r * d..(r + 1) * d]);
            }
            match &self.dist {
                None => self.lm_head(pool, &s.o[..nr * d], nr, &mut out.logits),
                Some(t) => {
                    // this rank's vocabulary rows, then all ranks'
                    let own = resize(&mut s.g, nr * t.v_widths[t.layout.rank]);
                    matmul(pool, &self.output.view(&self.gguf), &s.o[..nr * d], nr, own);
                    out.logits.resize(nr * self.cfg.vocab, 0.0);
                    gather_columns(&*t.comm, &s.g[..nr * t.v_widths[t.layout.rank]], nr, &t.v_widths, &mut s.tmp, &mut out.logits)?;
                    self.softcap(&mut out.logits);
                }
            }
        } else {
            out.logits.clear();
        }
        Ok(())
    }

    /// On a split model, rank 0 tells the other ranks what this forward
    /// evaluates (see [`crate::shard`]); other ranks may not call forward.
    fn announce(&self, caches: &[&KvCache], tokens: &[u32], starts: &[usize], rows: &[usize]) -> Result<(), ModelError> {
        let Some(t) = &self.dist else { return Ok(()) };
        if !t.layout.is_leader() {
            return Err(ModelError::Shard(format!("rank {} called a forward pass; only rank 0 does", t.layout.rank)));
        }
        let segs = caches
            .iter()
            .enumerate()
            .map(|(j, c)| FrameSeg { id: c.id(), ctx: c.ctx(), start: c.len(), tokens: tokens[starts[j]..starts[j + 1]].to_vec() })
            .collect();
        let mut frame = Vec::new();
        Frame::Forward { segs, rows: rows.to_vec() }.encode(&mut frame);
        t.comm.broadcast(&mut frame)
    }

    /// Rank 0 of a split model: tell the other ranks to return from
    /// [`follow`](Self::follow).
    pub fn stop_followers(&self) -> Result<(), ModelError> {
        match &self.dist {
            Some(t) if t.layout.is_leader() => {
                let mut frame = Vec::new();
                Frame::Stop.encode(&mut frame);
                t.comm.broadcast(&mut frame)
            }
            _ => Ok(()),
        }
    }

    /// The loop of ranks other than 0 on a split model: receive each frame
    /// of the leader, bring the caches it names to its start positions (a
    /// rollback on the leader is a shorter start here), and run the same
    /// forward on this rank's share. Returns when the leader stops.
    pub fn follow(&self, pool: &ThreadPool) -> Result<(), ModelError> {
        let Some(t) = &self.dist else { return Err(ModelError::Shard("follow: the model is not split".into())) };
        if t.layout.is_leader() {
            return Err(ModelError::Shard("follow: rank 0 leads".into()));
        }
        let mut caches: std::collections::HashMap<u64, KvCache> = std::collections::HashMap::new();
        let mut frame = Vec::new();
        let mut out = ForwardOutput::default();
        loop {
            t.comm.broadcast(&mut frame)?;
            let (segs, rows) = match Frame::decode(&frame)? {
                Frame::Stop => return Ok(()),
                Frame::Forward { segs, rows } => (segs, rows),
            };
            let mut starts = vec![0];
            let mut tokens = Vec::new();
            for sg in &segs {
                let c = caches.entry(sg.id).or_insert_with(|| self.new_cache(sg.ctx));
                c.truncate(sg.start);
                if c.len() != sg.start {
                    return Err(ModelError::Shard(format!(
                        "rank {}: sequence {} is at position {} here, {} on the leader",
                        t.layout.rank,
                        sg.id,
                        c.len(),
                        sg.start
                    )));
                }
                tokens.extend_from_slice(&sg.tokens);
                starts.push(tokens.len());
            }
            let m = tokens.len();
            self.check_inputs(&tokens, &[])?;
            out.rows = rows;
            if m == 0 {
                continue;
            }
            SCRATCH.with(|s| -> Result<(), ModelError> {
                let s = &mut *s.borrow_mut();
                self.embed_rows(&tokens, s);
                for (j, sg) in segs.iter().enumerate() {
                    for i in starts[j]..starts[j + 1] {
                        rope_row(&self.cfg, s, m, i, sg.start + i - starts[j]);
                    }
                }
                // the caches named, in segment order (a sequence appears once per frame)
                let mut by_id: std::collections::HashMap<u64, &mut KvCache> = caches.iter_mut().map(|(k, v)| (*k, v)).collect();
                let mut refs: Vec<&mut KvCache> = Vec::with_capacity(segs.len());
                for sg in &segs {
                    refs.push(by_id.remove(&sg.id).ok_or_else(|| ModelError::Shard("a sequence twice in one frame".into()))?);
                }
                if refs.len() == 1 {
                    self.run_layers(pool, &mut Kv::One(&mut *refs[0]), m, &[], s, &mut out)?;
                } else {
                    self.run_layers(pool, &mut Kv::Segs { caches: &mut refs, starts: &starts }, m, &[], s, &mut out)?;
                }
                for (j, c) in refs.iter_mut().enumerate() {
                    c.commit(starts[j + 1] - starts[j]);
                }
                self.output_rows(pool, m, &[], s, &mut out)
            })?;
        }
    }

    /// Evaluate `tokens` at positions `cache.len()..`, append their K/V rows to
    /// the cache, and fill `out` with the logits and hidden states asked for.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        cache: &mut KvCache,
        tokens: &[u32],
        rows: &LogitRows,
        taps: &[HiddenTap],
        out: &mut ForwardOutput,
    ) -> Result<(), ModelError> {
        let cfg = &self.cfg;
        let m = tokens.len();
        if cache.len() + m > cache.ctx() {
            return Err(ModelError::ContextFull { have: cache.len(), add: m, ctx: cache.ctx() });
        }
        self.check_inputs(tokens, taps)?;
        let logit_rows: Vec<usize> = match rows {
            LogitRows::None => vec![],
            LogitRows::Last => {
                if m > 0 {
                    vec![m - 1]
                } else {
                    vec![]
                }
            }
            LogitRows::All => (0..m).collect(),
            LogitRows::Rows(r) => r.clone(),
        };
        if let Some(&r) = logit_rows.iter().find(|&&r| r >= m) {
            return Err(ModelError::BadRow { row: r, m });
        }
        out.rows = logit_rows;
        out.hidden.clear();
        out.hidden.resize(taps.len(), Vec::new());
        if m == 0 {
            out.logits.clear();
            return Ok(());
        }
        let p0 = cache.len();
        self.announce(&[&*cache], tokens, &[0, m], &out.rows)?;

        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            // embeddings
            self.embed_rows(tokens, s);
            // RoPE angles per row
            for i in 0..m {
                rope_row(cfg, s, m, i, p0 + i);
            }

            self.run_layers(pool, &mut Kv::One(&mut *cache), m, taps, s, out)?;
            cache.commit(m);

            self.output_rows(pool, m, taps, s, out)
        })
    }

    /// One decode step for each of several sequences at once: row i is
    /// `tokens[i]` at position `caches[i].len()` of sequence i. Every row's
    /// logits (`out.rows` = all rows) and taps have the same bits as a
    /// one-token [`Model::forward`] on that sequence alone.
    pub fn forward_multi(
        &self,
        pool: &ThreadPool,
        caches: &mut [&mut KvCache],
        tokens: &[u32],
        taps: &[HiddenTap],
        out: &mut ForwardOutput,
    ) -> Result<(), ModelError> {
        if caches.len() != tokens.len() {
            return Err(ModelError::BadConfig(format!("forward_multi: {} tokens for {} caches", tokens.len(), caches.len())));
        }
        let segs: Vec<Segment> = tokens.iter().map(|t| Segment { tokens: std::slice::from_ref(t), logits: SegmentLogits::All }).collect();
        self.forward_batch(pool, caches, &segs, taps, out)
    }

    /// Several sequences in one forward: segment j is `segs[j].tokens` at
    /// positions `caches[j].len()..` of sequence j (a decode row, the rows
    /// of a speculative verify, or a chunk of a prompt). The matmuls run on
    /// all rows together; attention reads each row's own cache. Rows are
    /// numbered in segment order; `out.rows` lists those given logits (as
    /// each segment asks) and every tap holds all rows. Each row's logits
    /// and taps have the same bits as [`Model::forward`] of its segment on
    /// that sequence alone.
    pub fn forward_batch(
        &self,
        pool: &ThreadPool,
        caches: &mut [&mut KvCache],
        segs: &[Segment],
        taps: &[HiddenTap],
        out: &mut ForwardOutput,
    ) -> Result<(), ModelError> {
        let cfg = &self.cfg;
        if caches.len() != segs.len() {
            return Err(ModelError::BadConfig(format!("forward_batch: {} segments for {} caches", segs.len(), caches.len())));
        }
        let mut starts = Vec::with_capacity(segs.len() + 1);
        starts.push(0);
        let mut tokens = Vec::new();
        let mut rows = Vec::new();
        for (c, seg) in caches.iter().zip(segs) {
            let n = seg.tokens.len();
            if c.len() + n > c.ctx() {
                return Err(ModelError::ContextFull { have: c.len(), add: n, ctx: c.ctx() });
            }
            if c.n_layer() != cfg.n_layer || c.kv_dim() != self.kv_dim_here() {
                return Err(ModelError::BadConfig("forward_batch: a cache of another model".into()));
            }
            let s0 = tokens.len();
            match seg.logits {
                SegmentLogits::None => {}
                SegmentLogits::Last if n > 0 => rows.push(s0 + n - 1),
                SegmentLogits::Last => {}
                SegmentLogits::All => rows.extend(s0..s0 + n),
            }
            tokens.extend_from_slice(seg.tokens);
            starts.push(tokens.len());
        }
        let m = tokens.len();
        self.check_inputs(&tokens, taps)?;
        out.rows = rows;
        out.hidden.clear();
        out.hidden.resize(taps.len(), Vec::new());
        if m == 0 {
            out.logits.clear();
            return Ok(());
        }
        if self.dist.is_some() {
            let refs: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
            self.announce(&refs, &tokens, &starts, &out.rows)?;
        }
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            self.embed_rows(&tokens, s);
            for (j, c) in caches.iter().enumerate() {
                for i in starts[j]..starts[j + 1] {
                    rope_row(cfg, s, m, i, c.len() + i - starts[j]);
                }
            }
            // one sequence (a server with one client) attends as `forward`
            // does: a verify's rows share each cached block
            if let [one] = &mut *caches {
                self.run_layers(pool, &mut Kv::One(one), m, taps, s, out)?;
            } else {
                self.run_layers(pool, &mut Kv::Segs { caches: &mut *caches, starts: &starts }, m, taps, s, out)?;
            }
            for (j, c) in caches.iter_mut().enumerate() {
                c.commit(starts[j + 1] - starts[j]);
            }
            self.output_rows(pool, m, taps, s, out)
        })
    }
}

/// Which rows of a segment of [`Model::forward_batch`] get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentLogits {
    None,
    /// The segment's last row (a prompt chunk).
    Last,
    /// Every row (a decode row, a verify pass).
    All,
}

/// One sequence's rows in a [`Model::forward_batch`].
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    pub tokens: &'a [u32],
    pub logits: SegmentLogits,
}

/// RoPE angles of row `i` (of `m`) at position `pos`: `s.cs` with the
/// global base, and `s.cs_local` with the local one where the model has
/// local layers.
pub(crate) fn rope_row(cfg: &Config, s: &mut Scratch, m: usize, i: usize, pos: usize) {
    let half = cfg.rope_dim / 2;
    s.cs.resize(m * half, (0.0, 0.0));
    ops::rope_angles(pos, cfg.rope_dim, cfg.rope_base, cfg.rope_scale, &mut s.cs[i * half..(i + 1) * half]);
    if cfg.has_window() {
        s.cs_local.resize(m * half, (0.0, 0.0));
        ops::rope_angles(pos, cfg.rope_dim, cfg.rope_base_local, 1.0, &mut s.cs_local[i * half..(i + 1) * half]);
    }
}

fn rope(style: RopeStyle, x: &mut [f32], cs: &[(f32, f32)]) {
    match style {
        RopeStyle::Pairs => ops::rope_pairs(x, cs),
        RopeStyle::Halves => ops::rope_halves(x, cs),
    }
}

/// The cache(s) a forward pass appends to.
pub(crate) enum Kv<'a, 'b> {
    /// One sequence: the rows are consecutive positions `len..len+m`.
    One(&'a mut KvCache),
    /// Segments of several sequences: rows `starts[j]..starts[j + 1]` are
    /// positions `caches[j].len()..` of sequence j.
    Segs { caches: &'a mut [&'b mut KvCache], starts: &'a [usize] },
}

impl Kv<'_, '_> {
    /// The cache row `i` attends over, and its position.
    fn row(&self, i: usize) -> (&KvCache, usize) {
        match self {
            Kv::One(c) => (&**c, c.len() + i),
            Kv::Segs { caches, starts } => {
                let j = starts.partition_point(|&s| s <= i) - 1;
                (&*caches[j], caches[j].len() + i - starts[j])
            }
        }
    }
}

/// The sizes both attention passes work with.
struct AttnShape {
    /// Head size, key/value width and query width of a row.
    hd: usize,
    kvd: usize,
    qd: usize,
    /// Query heads per key/value head.
    group: usize,
    /// Score scale (1/√head size for most models).
    scale: f32,
    /// Query heads.
    nh: usize,
}

impl AttnShape {
    fn of(cfg: &Config) -> AttnShape {
        let hd = cfg.head_dim;
        AttnShape { hd, kvd: cfg.kv_dim(), qd: cfg.q_dim(), group: cfg.n_head / cfg.n_kv_head, scale: cfg.attn_scale, nh: cfg.n_head }
    }
}

/// A part of two rows' positions in a block: positions only row `k` of the
/// two attends (`One(k, a, b)`), or positions both attend (`Both(a, b)`).
/// Ranges are half-open and may be empty.
enum PairPart {
    One(usize, usize, usize),
    Both(usize, usize),
}

/// Two rows' position ranges as the parts each attends alone and the part
/// both attend, in an order that keeps each row's positions ascending (what
/// a row has alone before the shared part, the shared part, what it has
/// alone after), so value rows still accumulate in position order.
fn pair_parts([(a0, b0), (a1, b1)]: [(usize, usize); 2]) -> [PairPart; 5] {
    use PairPart::*;
    let (lo, hi) = (a0.max(a1), b0.min(b1));
    if lo >= hi {
        return [One(0, a0, b0), One(1, a1, b1), Both(0, 0), One(0, 0, 0), One(1, 0, 0)];
    }
    [One(0, a0, lo), One(1, a1, lo), Both(lo, hi), One(0, hi, b0), One(1, hi, b1)]
}

/// Causal attention of `m` consecutive rows of one sequence, one query head
/// (or one key/value head's group of them) per unit of work: each block of
/// cached keys (then values) of the head is read once from memory for all
/// rows (and heads). At long contexts the cache is larger than
/// the weights and a row-by-row pass streams it once per row, so a verify
/// row cost most of a plain step; here it costs its arithmetic.
///
/// Row `i` still computes exactly what it computes alone: its scores are
/// the same per-position dot products over the same positions (its window,
/// on a local layer), its softmax runs over the same scores, and its output
/// accumulates the value rows in position order (`axpy_rows` over
/// consecutive blocks is the same sequence of FMAs as over the whole range).
fn attention_rows(pool: &ThreadPool, cfg: &Config, cache: &KvCache, layer: usize, m: usize, q: &[f32], out: &mut [f32]) {
    let AttnShape { hd, kvd, qd, group, scale, nh } = AttnShape::of(cfg);
    let base = cache.len();
    let lr = cache.rows(layer);
    // scores of row i at sc[i * span + (p - lo)], p in first(base + i)..=base + i
    let lo = lr.first(base);
    let last = base + m;
    let span = last - lo;
    // query heads per unit: a whole group where the groups divide evenly
    // over the threads (each key/value block then serves every head of the
    // group), else one
    let hs = if cfg.n_kv_head.is_multiple_of(pool.threads()) { group } else { 1 };
    // rows in parts where the units of heads would not divide evenly over
    // the threads (SmolLM2's 9 heads on 2 threads left one thread a fifth
    // of the attention idle); parts of at least two rows keep rows in pairs
    let units = nh / hs;
    let rs = if units.is_multiple_of(pool.threads()) || m < 2 * pool.threads() { 1 } else { pool.threads() };
    // rows per part, even so that parts start on a pair
    let mp = m.div_ceil(2 * rs) * 2;
    HEAD_ROWS.with(|tmp| {
        let mut tmp = tmp.borrow_mut();
        let tmp = resize(&mut tmp, units * rs * hs * mp * hd);
        pool.run_pieces(
            tmp,
            hs * mp * hd,
            |u| u,
            || (),
            |_, u, o| {
                let (u, r0) = (u / rs, (u % rs) * mp);
                // rows r0..r0 + mr of heads u·hs..(u + 1)·hs; o holds mp rows a head
                let mr = mp.min(m.saturating_sub(r0));
                let off = (u * hs / group) * hd;
                SCORES.with(|sc| {
                    let mut sc = sc.borrow_mut();
                    let sc = resize(&mut sc, hs * mr * span);
                    // rows in pairs: a pair shares each key and value row's
                    // loads and arithmetic where their positions overlap
                    for p0 in (lo / POS_BLOCK * POS_BLOCK..last).step_by(POS_BLOCK) {
                        let range = |i: usize| (p0.max(lr.first(base + r0 + i)), (p0 + POS_BLOCK).min(base + r0 + i + 1));
                        for (hh, sh) in sc.chunks_mut(mr * span).enumerate() {
                            let h = u * hs + hh;
                            let qi = |i: usize| &q[(r0 + i) * qd + h * hd..][..hd];
                            for (pair, sp) in sh.chunks_mut(2 * span).enumerate() {
                                let i = 2 * pair;
                                if sp.len() == span {
                                    let (a, b) = range(i);
                                    lr.runs(a, b, |a, b, at| lr.k.dot_rows(qi(i), at, kvd, off, scale, &mut sp[a - lo..b - lo]));
                                    continue;
                                }
                                let (s0, s1) = sp.split_at_mut(span);
                                for part in pair_parts([range(i), range(i + 1)]) {
                                    match part {
                                        PairPart::One(k, a, b) => {
                                            let sk = if k == 0 { &mut *s0 } else { &mut *s1 };
                                            lr.runs(a, b, |a, b, at| {
                                                lr.k.dot_rows(qi(i + k), at, kvd, off, scale, &mut sk[a - lo..b - lo])
                                            });
                                        }
                                        PairPart::Both(a, b) => lr.runs(a, b, |a, b, at| {
                                            lr.k.dot_rows2(
                                                [qi(i), qi(i + 1)],
                                                at,
                                                kvd,
                                                off,
                                                scale,
                                                [&mut s0[a - lo..b - lo], &mut s1[a - lo..b - lo]],
                                            )
                                        }),
                                    }
                                }
                            }
                        }
                    }
                    for sh in sc.chunks_mut(mr * span) {
                        for i in 0..mr {
                            let r = i * span;
                            let g = base + r0 + i;
                            ops::softmax_inplace(&mut sh[r + lr.first(g) - lo..r + g + 1 - lo]);
                        }
                    }
                    o.iter_mut().for_each(|v| *v = 0.0);
                    for p0 in (lo / POS_BLOCK * POS_BLOCK..last).step_by(POS_BLOCK) {
                        let range = |i: usize| (p0.max(lr.first(base + r0 + i)), (p0 + POS_BLOCK).min(base + r0 + i + 1));
                        for (oh, sh) in o.chunks_mut(mp * hd).zip(sc.chunks(mr * span)) {
                            let si = |i: usize, a: usize, b: usize| &sh[i * span + a - lo..i * span + b - lo];
                            for (pair, op) in oh[..mr * hd].chunks_mut(2 * hd).enumerate() {
                                let i = 2 * pair;
                                if op.len() == hd {
                                    let (a, b) = range(i);
                                    lr.runs(a, b, |a, b, at| lr.v.axpy_rows(op, si(i, a, b), at, kvd, off));
                                    continue;
                                }
                                let (o0, o1) = op.split_at_mut(hd);
                                // each row's positions stay in order: what it has
                                // alone before the shared part, the shared part,
                                // what it has alone after
                                for part in pair_parts([range(i), range(i + 1)]) {
                                    match part {
                                        PairPart::One(k, a, b) => {
                                            let ok = if k == 0 { &mut *o0 } else { &mut *o1 };
                                            lr.runs(a, b, |a, b, at| lr.v.axpy_rows(ok, si(i + k, a, b), at, kvd, off));
                                        }
                                        PairPart::Both(a, b) => lr.runs(a, b, |a, b, at| {
                                            lr.v.axpy_rows2([&mut *o0, &mut *o1], [si(i, a, b), si(i + 1, a, b)], at, kvd, off)
                                        }),
                                    }
                                }
                            }
                        }
                    }
                });
            },
        );
        // piece u·rs + k holds heads u·hs.., rows k·mp.., mp rows a head
        for (p, piece) in tmp.chunks_exact(hs * mp * hd).enumerate() {
            let (u, r0) = (p / rs, (p % rs) * mp);
            for (hh, rows) in piece.chunks_exact(mp * hd).enumerate() {
                let h = u * hs + hh;
                for (i, r) in rows.chunks_exact(hd).take(m.saturating_sub(r0)).enumerate() {
                    out[(r0 + i) * qd + h * hd..][..hd].copy_from_slice(r);
                }
            }
        }
    });
}

/// Causal attention of rows of several sequences (a batch step), of a
/// prompt chunk, or of a decode step at a long span, one unit of work per
/// (row, key/value head): the query heads that share a key/value head walk
/// its positions together, block by block, so each block is read from
/// memory once for all of them. Rows of different
/// sequences share nothing, and a step of 8–16 sequences reads 8–16
/// caches; reading each once instead of once per query head is what
/// keeps their attention near the cost of the bytes.
///
/// Each head's scores are the same per-position dot products, its softmax
/// runs over the same scores and its output accumulates the value rows in
/// position order, so every row has the bits it has alone.
fn attention_groups(pool: &ThreadPool, cfg: &Config, kv: &Kv, layer: usize, m: usize, q: &[f32], out: &mut [f32]) {
    let AttnShape { hd, kvd, qd, group, scale, nh } = AttnShape::of(cfg);
    let nkv = nh / group;
    // unit u is key/value head u / m of row u % m; its piece is the row's
    // output of the group's query heads (contiguous)
    pool.run_pieces(
        &mut out[..m * qd],
        hd * group,
        |u| (u % m) * nkv + u / m,
        || (),
        |_, u, o| {
            let (g, i) = (u / m, u % m);
            let (cache, pos) = kv.row(i);
            let lr = cache.rows(layer);
            let (lo, n) = (lr.first(pos), pos + 1);
            let span = n - lo;
            let off = g * hd;
            SCORES.with(|sc| {
                let mut sc = sc.borrow_mut();
                let sc = resize(&mut sc, group * span);
                // query heads in pairs: a pair shares each key and value
                // row's loads and arithmetic
                let qj = |j: usize| &q[i * qd + (g * group + j) * hd..][..hd];
                for p0 in (lo / POS_BLOCK * POS_BLOCK..n).step_by(POS_BLOCK) {
                    let (a, b) = (p0.max(lo), (p0 + POS_BLOCK).min(n));
                    for (pair, sp) in sc.chunks_mut(2 * span).enumerate() {
                        let j = 2 * pair;
                        if sp.len() == span {
                            lr.runs(a, b, |a, b, at| lr.k.dot_rows(qj(j), at, kvd, off, scale, &mut sp[a - lo..b - lo]));
                        } else {
                            let (s0, s1) = sp.split_at_mut(span);
                            lr.runs(a, b, |a, b, at| {
                                lr.k.dot_rows2([qj(j), qj(j + 1)], at, kvd, off, scale, [&mut s0[a - lo..b - lo], &mut s1[a - lo..b - lo]])
                            });
                        }
                    }
                }
                for j in 0..group {
                    ops::softmax_inplace(&mut sc[j * span..(j + 1) * span]);
                }
                o.iter_mut().for_each(|v| *v = 0.0);
                for p0 in (lo / POS_BLOCK * POS_BLOCK..n).step_by(POS_BLOCK) {
                    let (a, b) = (p0.max(lo), (p0 + POS_BLOCK).min(n));
                    for (pair, op) in o.chunks_mut(2 * hd).enumerate() {
                        let j = 2 * pair;
                        let sj = |j: usize, a: usize, b: usize| &sc[j * span + a - lo..j * span + b - lo];
                        if op.len() == hd {
                            lr.runs(a, b, |a, b, at| lr.v.axpy_rows(op, sj(j, a, b), at, kvd, off));
                        } else {
                            let (o0, o1) = op.split_at_mut(hd);
                            lr.runs(a, b, |a, b, at| lr.v.axpy_rows2([&mut *o0, &mut *o1], [sj(j, a, b), sj(j + 1, a, b)], at, kvd, off));
                        }
                    }
                }
            });
        },
    );
}

/// Causal attention of `m` query rows over the cache(s). Each (row, head) is
/// one unit of work; its result depends only on its own query and the cache
/// rows of its window, so a row gives the same bits alone, in a batch of
/// its own sequence, or beside rows of other sequences.
fn attention(pool: &ThreadPool, cfg: &Config, kv: &Kv, layer: usize, m: usize, q: &[f32], out: &mut [f32]) {
    if let Kv::One(cache) = kv {
        if (2..=ROW_BATCH_MAX).contains(&m) {
            return attention_rows(pool, cfg, cache, layer, m, q, out);
        }
        // A decode step's row by key/value head: the query heads of a
        // group read the head's cached rows once instead of once each.
        // Where the groups do not divide evenly over the threads, the
        // uneven split costs more than the reads save until the span is
        // long (on an Intel Xeon with 2 threads, SmolLM2's 3 groups broke
        // even near 1,200 positions and were 13% faster at 1,700,
        // docs/experiments/009 §10). Prompt chunks always go by group:
        // they have units enough to balance.
        let pos = cache.len();
        let span = pos + 1 - cache.rows(layer).first(pos);
        if m > ROW_BATCH_MAX || cfg.n_kv_head.is_multiple_of(pool.threads()) || span >= GROUP_SPAN_MIN {
            return attention_groups(pool, cfg, kv, layer, m, q, out);
        }
    }
    if let Kv::Segs { .. } = kv {
        return attention_groups(pool, cfg, kv, layer, m, q, out);
    }
    let AttnShape { hd, kvd, qd, group, scale, nh } = AttnShape::of(cfg);
    // a decode step at a short span: unit u is head u / m of row u % m
    // (m is 1), so that the query heads split evenly over the threads
    pool.run_pieces(
        &mut out[..m * qd],
        hd,
        |u| (u % m) * nh + u / m,
        || (),
        |_, u, o| {
            let (h, i) = (u / m, u % m);
            let (cache, pos) = kv.row(i);
            let lr = cache.rows(layer);
            let (lo, n) = (lr.first(pos), pos + 1);
            let off = (h / group) * hd;
            let qh = &q[i * qd + h * hd..i * qd + (h + 1) * hd];
            SCORES.with(|sc| {
                let mut sc = sc.borrow_mut();
                let sc = resize(&mut sc, n - lo);
                // key and value head h / group of positions lo..n, in order
                lr.runs(lo, n, |a, b, at| lr.k.dot_rows(qh, at, kvd, off, scale, &mut sc[a - lo..b - lo]));
                ops::softmax_inplace(sc);
                o.iter_mut().for_each(|v| *v = 0.0);
                lr.runs(lo, n, |a, b, at| lr.v.axpy_rows(o, &sc[a - lo..b - lo], at, kvd, off));
            });
        },
    );
}
