//! The DSpark support file's format (llama.cpp's `dflash` layout plus
//! tandem's copy-hint metadata): keys, the configuration it declares and
//! how it is validated, and the drafter's weights in f32 as the trainer
//! initialises, writes and reads them back. The runtime drafter
//! ([`super::DSparkModel`]) loads a file into packed weights.

use tandem_gguf::{GgmlType, Gguf, Value};

use crate::support::{SupportError, SupportKind, TargetId};
use crate::transformer::HiddenTap;
use crate::{Model, ModelError};

pub const ARCH: &str = "dflash";
pub const KIND: &str = "dspark";

/// Metadata keys (llama.cpp's `dflash.*`, plus the mask token).
pub mod keys {
    pub const BLOCK_SIZE: &str = "dflash.block_size";
    pub const TARGET_LAYERS: &str = "dflash.target_layers";
    pub const SAMPLE_FROM_ANCHOR: &str = "dflash.sample_from_anchor";
    pub const HAS_CONF: &str = "dflash.has_confidence_head";
    pub const BLOCK_COUNT: &str = "dflash.block_count";
    pub const WIDTH: &str = "dflash.embedding_length";
    pub const FFN: &str = "dflash.feed_forward_length";
    pub const HEADS: &str = "dflash.attention.head_count";
    pub const KV_HEADS: &str = "dflash.attention.head_count_kv";
    pub const KEY_LENGTH: &str = "dflash.attention.key_length";
    pub const VALUE_LENGTH: &str = "dflash.attention.value_length";
    pub const EPS: &str = "dflash.attention.layer_norm_rms_epsilon";
    pub const ROPE_BASE: &str = "dflash.rope.freq_base";
    pub const CTX: &str = "dflash.context_length";
    pub const VOCAB: &str = "dflash.vocab_size";
    pub const MASK: &str = "tokenizer.ggml.mask_token_id";
    /// Copy hints (tandem's own keys; llama.cpp ignores them and drafts
    /// without hints): per suffix length n = 1..=len, the logit bias on the
    /// hinted token's row and the confidence bias.
    pub const COPY_BIAS: &str = "tandem-dspark.copy_bias";
    pub const COPY_CONF_BIAS: &str = "tandem-dspark.copy_conf_bias";
    /// Optional, with the copy hints: per suffix length, the factor on the
    /// hinted token's embedding added to slot 0's input (the anchor's).
    pub const COPY_EMBED: &str = "tandem-dspark.copy_embed";
    /// llama.cpp's backbone options ([`super::Backbone`]).
    pub const CAUSAL: &str = "dflash.attention.causal";
    pub const EMBED_SCALE: &str = "dflash.embedding_scale";
    pub const ATTN_SCALE: &str = "dflash.attention.scale";
    pub const VALUE_SCALE: &str = "dflash.attention.value_scale";
    pub const ACTIVATION: &str = "dflash.hidden_activation";
    pub const ROPE_DIMS: &str = "dflash.rope.dimension_count";
    pub const ROPE_SECTIONS: &str = "dflash.rope.dimension_sections";
    pub const ROPE_SCALING: &str = "dflash.rope.scaling.type";
    pub const ROPE_FACTOR: &str = "dflash.rope.scaling.factor";
    pub const ROPE_SCALE_LINEAR: &str = "dflash.rope.scale_linear";
    pub const ROPE_ATTN_FACTOR: &str = "dflash.rope.scaling.attn_factor";
    pub const SLIDING_WINDOW: &str = "dflash.attention.sliding_window";
    pub const SLIDING_PATTERN: &str = "dflash.attention.sliding_window_pattern";
    /// Keys of drafters tandem refuses (DFlash2, DeepSeek-V4, mixture of experts).
    pub const DFLASH2: [&str; 4] = ["dflash.conv_kernel_size", "dflash.conv_group_size", "dflash.selector_rank", "dflash.selector_top_k"];
    pub const HYPER_CONNECTIONS: &str = "dflash.hyper_connection.count";
    pub const EXPERTS: &str = "dflash.expert_count";
}

/// Optional per-layer tensors of llama.cpp's DFlash backbone (`blk.N.<name>`).
pub const OPTIONAL_BLOCK_TENSORS: [&str; 4] =
    ["attn_sinks.weight", "post_attention_norm.weight", "post_ffw_norm.weight", "layer_output_scale.weight"];

/// Tensors outside the blocks that a DFlash/DSpark file may hold.
const TOP_TENSORS: [&str; 11] = [
    "fc.weight",
    "enc.output_norm.weight",
    "output_norm.weight",
    "output.weight",
    "token_embd.weight",
    "d2t",
    "markov_w1.weight",
    "markov_w2.weight",
    "conf_proj.weight",
    "conf_proj.bias",
    "rope_freqs.weight",
];

/// Longest copy-hint suffix a file may ask for.
pub const MAX_COPY_NGRAM: usize = 16;

/// Backbone block tensors (`blk.N.<name>`).
pub const BLOCK_TENSORS: [&str; 11] = [
    "attn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "attn_q_norm.weight",
    "attn_k_norm.weight",
    "ffn_norm.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
];

/// Hyper-parameters of a DSpark drafter.
#[derive(Debug, Clone, PartialEq)]
pub struct DSparkConfig {
    /// Backbone layers.
    pub n_layer: usize,
    /// Width (must equal the target's: the token embedding is shared).
    pub d_model: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub eps: f32,
    pub rope_base: f32,
    pub ctx: usize,
    /// Trained block size B (slots per draft pass).
    pub block_size: usize,
    /// Target layers whose *inputs* feed the drafter (1..=target layers;
    /// `n` = the input of layer n = the output of layer n − 1).
    pub target_layers: Vec<usize>,
    /// Slot 0 (the anchor) predicts too (DSpark); false: DFlash style.
    pub sample_from_anchor: bool,
    pub mask_token: u32,
    pub markov_rank: usize,
    /// Rows of the draft vocabulary (target vocabulary without `d2t`).
    pub draft_vocab: usize,
    pub has_conf: bool,
    /// Copy hints: `copy_bias[n − 1]` is added to the logit of the token that
    /// followed the latest earlier occurrence of the text's last n tokens
    /// (the longest such suffix, [`crate::mtp::copy_hint`]), and
    /// `copy_conf_bias[n − 1]` to that slot's confidence logit. Empty: none.
    pub copy_bias: Vec<f32>,
    pub copy_conf_bias: Vec<f32>,
    /// Slot 0's hint as an input: `copy_embed[n − 1]` times the hinted
    /// token's embedding is added to the anchor's embedding (the hint over
    /// the history and the anchor is known before the backbone runs). Empty:
    /// none; else as long as `copy_bias`.
    pub copy_embed: Vec<f32>,
}

impl DSparkConfig {
    /// A drafter shaped like `target`'s blocks: `n_layer` backbone layers,
    /// block size `block_size`, taps `target_layers`, Markov rank `rank`,
    /// a draft vocabulary of `draft_vocab` rows (the target's when equal),
    /// mask token `mask`, with a confidence head.
    pub fn for_target(
        target: &crate::Config,
        n_layer: usize,
        block_size: usize,
        target_layers: Vec<usize>,
        rank: usize,
        draft_vocab: usize,
        mask: u32,
    ) -> Self {
        DSparkConfig {
            n_layer,
            d_model: target.d_model,
            n_head: target.n_head,
            n_kv_head: target.n_kv_head,
            head_dim: target.head_dim,
            ffn: target.ffn,
            eps: target.eps,
            rope_base: target.rope_base,
            ctx: target.ctx_train,
            block_size,
            target_layers,
            sample_from_anchor: true,
            mask_token: mask,
            markov_rank: rank,
            draft_vocab,
            has_conf: true,
            copy_bias: Vec::new(),
            copy_conf_bias: Vec::new(),
            copy_embed: Vec::new(),
        }
    }

    /// Longest suffix the copy hints look for (0: no hints).
    pub fn copy_ngram(&self) -> usize {
        self.copy_bias.len()
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
    /// Width of one context feature row (m · d).
    pub fn feat_dim(&self) -> usize {
        self.target_layers.len() * self.d_model
    }
    /// The target hidden taps, in `target_layers` order.
    pub fn taps(&self) -> Vec<HiddenTap> {
        self.target_layers.iter().map(|&l| HiddenTap::Layer(l - 1)).collect()
    }
    /// Whether the file has a DSpark Markov head (else: plain DFlash, raw
    /// argmax of each slot's logits).
    pub fn has_markov(&self) -> bool {
        self.markov_rank > 0
    }
    /// Drafts one pass can make.
    pub fn max_draft(&self) -> usize {
        if self.sample_from_anchor {
            self.block_size
        } else {
            self.block_size - 1
        }
    }

    /// Shape `(out, in)` of backbone tensor `what` (vectors: `(len, 1)`).
    pub fn block_shape(&self, what: &str) -> (usize, usize) {
        let (d, qd, kvd, f) = (self.d_model, self.q_dim(), self.kv_dim(), self.ffn);
        match what {
            "attn_q.weight" => (qd, d),
            "attn_k.weight" | "attn_v.weight" => (kvd, d),
            "attn_output.weight" => (d, qd),
            "ffn_gate.weight" | "ffn_up.weight" => (f, d),
            "ffn_down.weight" => (d, f),
            "attn_q_norm.weight" | "attn_k_norm.weight" => (self.head_dim, 1),
            _ => (d, 1),
        }
    }

    /// Read and validate the metadata of `g` against the target.
    pub fn from_gguf(g: &Gguf, target: &crate::Config) -> Result<Self, SupportError> {
        let kind = SupportKind::DSpark;
        let meta = |msg: String| SupportError::Metadata { kind, msg };
        match g.get("general.architecture") {
            Some(Value::String(a)) if a == ARCH => {}
            Some(Value::String(a)) => return Err(meta(format!("architecture is {a}, expected {ARCH}"))),
            _ => return Err(meta("missing key general.architecture".into())),
        }
        let num = |key: &str| -> Result<u64, SupportError> {
            match g.get(key) {
                None => Err(meta(format!("missing key {key}"))),
                Some(v) => v.as_u64().ok_or_else(|| meta(format!("{key} is not a non-negative integer"))),
            }
        };
        let opt_num = |key: &str| -> Result<Option<u64>, SupportError> {
            match g.get(key) {
                None => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| meta(format!("{key} is not a non-negative integer"))),
            }
        };
        let flag = |key: &str, default: bool| -> Result<bool, SupportError> {
            match g.get(key) {
                None => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                Some(Value::String(s)) if s == "true" || s == "false" => Ok(s == "true"),
                Some(_) => Err(meta(format!("{key} is not a boolean"))),
            }
        };
        let block_size = num(keys::BLOCK_SIZE)? as usize;
        if block_size == 0 || block_size > 64 {
            return Err(meta(format!("block_size {block_size}")));
        }
        let layers =
            crate::support::int_array(g, keys::TARGET_LAYERS, kind)?.ok_or_else(|| meta(format!("missing key {}", keys::TARGET_LAYERS)))?;
        if layers.is_empty() || layers.len() > 64 {
            return Err(meta(format!("{} target layers", layers.len())));
        }
        for &l in &layers {
            if l < 1 || l > target.n_layer as i64 {
                return Err(meta(format!("target layer {l} out of range ({} layers)", target.n_layer)));
            }
        }
        let n_layer = num(keys::BLOCK_COUNT)? as usize;
        let d_model = num(keys::WIDTH)? as usize;
        let n_head = num(keys::HEADS)? as usize;
        let n_kv_head = opt_num(keys::KV_HEADS)?.map_or(n_head, |v| v as usize);
        let ffn = num(keys::FFN)? as usize;
        if n_layer == 0 || n_layer > 64 {
            return Err(meta(format!("block_count {n_layer}")));
        }
        if d_model != target.d_model {
            return Err(meta(format!("embedding_length {d_model} differs from the target's {}", target.d_model)));
        }
        if n_head == 0 || n_kv_head == 0 || !n_head.is_multiple_of(n_kv_head) || n_head > 1024 || ffn == 0 || ffn > 1 << 20 {
            return Err(meta(format!("implausible sizes: {n_head} heads, {n_kv_head} KV heads, FFN {ffn}")));
        }
        let head_dim = opt_num(keys::KEY_LENGTH)?.map_or(d_model / n_head, |v| v as usize);
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > 1024 {
            return Err(meta(format!("head dimension {head_dim}")));
        }
        if let Some(v) = opt_num(keys::VALUE_LENGTH)? {
            if v as usize != head_dim {
                return Err(meta(format!("value_length {v} differs from key_length {head_dim}")));
            }
        }
        let eps = match g.get(keys::EPS) {
            Some(v) => v.as_f64().ok_or_else(|| meta(format!("{} is not a number", keys::EPS)))? as f32,
            None => return Err(meta(format!("missing key {}", keys::EPS))),
        };
        let rope_base = match g.get(keys::ROPE_BASE) {
            Some(v) => v.as_f64().ok_or_else(|| meta(format!("{} is not a number", keys::ROPE_BASE)))? as f32,
            None => 10000.0,
        };
        // written as negated ranges so that NaN fails them
        #[allow(clippy::nonminimal_bool)]
        let bad = !(eps > 0.0 && eps < 1.0) || !(rope_base > 1.0 && rope_base.is_finite());
        if bad {
            return Err(meta(format!("rms epsilon {eps} / rope base {rope_base}")));
        }
        let ctx = opt_num(keys::CTX)?.map_or(target.ctx_train, |v| v as usize).max(1);
        let mask = num(keys::MASK)?;
        if mask >= target.vocab as u64 {
            return Err(meta(format!("mask token {mask} outside the vocabulary of {}", target.vocab)));
        }
        // a file without a Markov head is a plain DFlash drafter: as in
        // llama.cpp, its anchor slot never predicts, whatever the key says
        let markov_rank = match g.tensor_info("markov_w1.weight") {
            Some(t) => t.dims.first().copied().unwrap_or(0) as usize,
            None => 0,
        };
        let sample_from_anchor = markov_rank > 0 && flag(keys::SAMPLE_FROM_ANCHOR, true)?;
        if !sample_from_anchor && block_size < 2 {
            return Err(meta(format!("block_size {block_size} leaves no draft slot without sample_from_anchor")));
        }
        if markov_rank > 4096 || (markov_rank == 0 && g.tensor_info("markov_w1.weight").is_some()) {
            return Err(meta(format!("Markov rank {markov_rank}")));
        }
        if markov_rank == 0 {
            for name in ["markov_w2.weight", "conf_proj.weight", "conf_proj.bias"] {
                if g.tensor_info(name).is_some() {
                    return Err(meta(format!("{name} without markov_w1.weight (a DSpark head needs its Markov head)")));
                }
            }
        }
        let draft_vocab = match g.tensor_info("d2t") {
            Some(t) => t.n_elements() as usize,
            None => target.vocab,
        };
        if draft_vocab == 0 || draft_vocab > target.vocab {
            return Err(meta(format!("draft vocabulary of {draft_vocab} rows (target vocabulary {})", target.vocab)));
        }
        let has_conf = g.tensor_info("conf_proj.weight").is_some();
        if flag(keys::HAS_CONF, has_conf)? != has_conf {
            return Err(meta(format!("{} disagrees with the presence of conf_proj.weight", keys::HAS_CONF)));
        }
        let floats = |key: &str| -> Result<Option<Vec<f32>>, SupportError> {
            match g.get(key) {
                None => Ok(None),
                Some(Value::Array(_, items)) => items
                    .iter()
                    .map(|v| match v.as_f64() {
                        Some(x) if x.is_finite() && x.abs() <= 1e4 => Ok(x as f32),
                        _ => Err(meta(format!("{key} holds a value that is not a finite number"))),
                    })
                    .collect::<Result<Vec<f32>, _>>()
                    .map(Some),
                Some(_) => Err(meta(format!("{key} is not an array"))),
            }
        };
        let (copy_bias, copy_conf_bias) = match (floats(keys::COPY_BIAS)?, floats(keys::COPY_CONF_BIAS)?) {
            (None, None) => (Vec::new(), Vec::new()),
            (Some(b), Some(c)) if b.len() == c.len() && (1..=MAX_COPY_NGRAM).contains(&b.len()) => (b, c),
            (b, c) => {
                return Err(meta(format!(
                    "copy hints need {} and {} with the same length in 1..={MAX_COPY_NGRAM} (got {} and {})",
                    keys::COPY_BIAS,
                    keys::COPY_CONF_BIAS,
                    b.map_or("none".into(), |v| format!("{} values", v.len())),
                    c.map_or("none".into(), |v| format!("{} values", v.len())),
                )))
            }
        };
        let copy_embed = match floats(keys::COPY_EMBED)? {
            None => Vec::new(),
            Some(v) if v.len() == copy_bias.len() => v,
            Some(v) => {
                return Err(meta(format!(
                    "{} needs one value per copy-hint length ({} values, {} has {})",
                    keys::COPY_EMBED,
                    v.len(),
                    keys::COPY_BIAS,
                    copy_bias.len()
                )))
            }
        };
        Ok(DSparkConfig {
            n_layer,
            d_model,
            n_head,
            n_kv_head,
            head_dim,
            ffn,
            eps,
            rope_base,
            ctx,
            block_size,
            target_layers: layers.iter().map(|&l| l as usize).collect(),
            sample_from_anchor,
            mask_token: mask as u32,
            markov_rank,
            draft_vocab,
            has_conf,
            copy_bias,
            copy_conf_bias,
            copy_embed,
        })
    }

    /// The metadata a file with this configuration carries.
    pub fn metadata(&self) -> Vec<(&'static str, Value)> {
        let mut m = vec![
            ("general.architecture", Value::String(ARCH.into())),
            (keys::BLOCK_SIZE, Value::U32(self.block_size as u32)),
            (
                keys::TARGET_LAYERS,
                Value::Array(tandem_gguf::ValueType::I32, self.target_layers.iter().map(|&l| Value::I32(l as i32)).collect()),
            ),
            (keys::SAMPLE_FROM_ANCHOR, Value::Bool(self.sample_from_anchor)),
            (keys::HAS_CONF, Value::Bool(self.has_conf)),
            (keys::BLOCK_COUNT, Value::U32(self.n_layer as u32)),
            (keys::WIDTH, Value::U32(self.d_model as u32)),
            (keys::FFN, Value::U32(self.ffn as u32)),
            (keys::HEADS, Value::U32(self.n_head as u32)),
            (keys::KV_HEADS, Value::U32(self.n_kv_head as u32)),
            (keys::KEY_LENGTH, Value::U32(self.head_dim as u32)),
            (keys::VALUE_LENGTH, Value::U32(self.head_dim as u32)),
            (keys::EPS, Value::F32(self.eps)),
            (keys::ROPE_BASE, Value::F32(self.rope_base)),
            (keys::CTX, Value::U32(self.ctx as u32)),
            (keys::MASK, Value::U32(self.mask_token)),
        ];
        if !self.copy_bias.is_empty() {
            let arr = |v: &[f32]| Value::Array(tandem_gguf::ValueType::F32, v.iter().map(|&x| Value::F32(x)).collect());
            m.push((keys::COPY_BIAS, arr(&self.copy_bias)));
            m.push((keys::COPY_CONF_BIAS, arr(&self.copy_conf_bias)));
            if !self.copy_embed.is_empty() {
                m.push((keys::COPY_EMBED, arr(&self.copy_embed)));
            }
        }
        m
    }
}

/// One backbone block in f32, each matrix `[out][in]` row-major.
#[derive(Debug, Clone)]
pub struct DSparkBlockWeights {
    /// Named as in [`BLOCK_TENSORS`].
    pub tensors: Vec<(String, Vec<f32>)>,
}

impl DSparkBlockWeights {
    pub fn get(&self, name: &str) -> &[f32] {
        &self.tensors.iter().find(|(n, _)| n == name).expect("block tensor").1
    }
}

/// A DSpark drafter's weights in f32, row-major `[out][in]`: what a trainer
/// holds and what [`DSparkWeights::to_gguf`] writes.
#[derive(Debug, Clone)]
pub struct DSparkWeights {
    pub cfg: DSparkConfig,
    /// d × (m·d).
    pub fc: Vec<f32>,
    pub enc_norm: Vec<f32>,
    pub blocks: Vec<DSparkBlockWeights>,
    pub output_norm: Vec<f32>,
    /// Own output head, `draft_vocab × d` (None: the target's, which needs a
    /// full draft vocabulary).
    pub output: Option<Vec<f32>>,
    /// Draft row → target token id.
    pub d2t: Option<Vec<u32>>,
    /// target vocab × rank.
    pub markov_w1: Vec<f32>,
    /// draft vocab × rank.
    pub markov_w2: Vec<f32>,
    /// `(w [d + rank], b)`.
    pub conf: Option<(Vec<f32>, f32)>,
}

pub(crate) fn dequant(g: &Gguf, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let (t, data) = g.tensor(name)?;
    if t.n_elements() as usize != len {
        return Err(ModelError::BadShape { name: name.into(), got: t.dims.clone(), want: vec![len as u64] });
    }
    let mut v = vec![0f32; len];
    tandem_kernels::quant::dequantize_row(t.ty, data, &mut v);
    Ok(v)
}

pub(crate) fn read_ids(ty: GgmlType, data: &[u8]) -> Option<Vec<i64>> {
    match ty {
        GgmlType::I32 => Some(data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect()),
        GgmlType::I64 => Some(data.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect()),
        _ => None,
    }
}

/// Tokenizer keys copied from the target into a drafter file (llama.cpp
/// loads a drafter as a model of its own, vocabulary included).
const TOKENIZER_KEYS: [&str; 10] = [
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
];

impl DSparkWeights {
    /// A fresh drafter for `target`: the backbone blocks start as copies of
    /// the target's last block (q/k norms 1), `fc` passes the last tap
    /// through, the output head is the target's rows for `d2t`, and the
    /// Markov and confidence heads start small. `seed` fixes the noise.
    pub fn init_from_target(target: &Model, cfg: DSparkConfig, d2t: Option<Vec<u32>>, seed: u64) -> Self {
        let tc = &target.cfg;
        let g = target.gguf();
        let d = tc.d_model;
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut noise = |scale: f32| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            ((rng >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        };
        let same_shape = cfg.n_head == tc.n_head && cfg.n_kv_head == tc.n_kv_head && cfg.head_dim == tc.head_dim && cfg.ffn == tc.ffn;
        let last = tc.n_layer - 1;
        let blocks = (0..cfg.n_layer)
            .map(|_| DSparkBlockWeights {
                tensors: BLOCK_TENSORS
                    .iter()
                    .map(|t| {
                        let (o, i) = cfg.block_shape(t);
                        let v = if t.ends_with("q_norm.weight") || t.ends_with("k_norm.weight") {
                            vec![1.0; o]
                        } else if same_shape {
                            let (info, data) = g.tensor(&format!("blk.{last}.{t}")).expect("target block tensor");
                            let mut v = vec![0f32; o * i];
                            tandem_kernels::quant::dequantize_row(info.ty, data, &mut v);
                            v
                        } else if i == 1 {
                            vec![1.0; o]
                        } else {
                            let s = 1.0 / (i as f32).sqrt();
                            (0..o * i).map(|_| noise(s)).collect()
                        };
                        (t.to_string(), v)
                    })
                    .collect(),
            })
            .collect();
        let m = cfg.target_layers.len();
        let mut fc: Vec<f32> = (0..d * m * d).map(|_| noise(0.01)).collect();
        for r in 0..d {
            fc[r * m * d + (m - 1) * d + r] += 1.0;
        }
        let mut output_norm = vec![0f32; d];
        let (info, data) = g.tensor("output_norm.weight").expect("output norm");
        tandem_kernels::quant::dequantize_row(info.ty, data, &mut output_norm);
        let head = target.output_weight().view(g);
        let rows: Vec<u32> = d2t.clone().unwrap_or_else(|| (0..tc.vocab as u32).collect());
        let mut output = vec![0f32; rows.len() * d];
        for (i, &r) in rows.iter().enumerate() {
            head.row_f32(r as usize, &mut output[i * d..(i + 1) * d]);
        }
        let r = cfg.markov_rank;
        let markov_w1 = (0..tc.vocab * r).map(|_| noise(0.02)).collect();
        let markov_w2 = vec![0f32; rows.len() * r];
        let conf = cfg.has_conf.then(|| (vec![0f32; d + r], 0.0));
        DSparkWeights { cfg, fc, enc_norm: vec![1.0; d], blocks, output_norm, output: Some(output), d2t, markov_w1, markov_w2, conf }
    }

    /// Write a support file for target `id` (whose GGUF `target` lends its
    /// tokenizer metadata). Matrices in `ty` (F32, F16 or Q8_0), vectors in
    /// F32, `d2t` as I64 (llama.cpp's type). `extra` metadata is added.
    pub fn to_gguf(
        &self,
        target: &Gguf,
        id: &TargetId,
        ty: GgmlType,
        extra: &[(String, Value)],
    ) -> Result<tandem_gguf::GgufWriter, tandem_gguf::GgufError> {
        use tandem_gguf::{GgufError, GgufWriter, TensorData};
        let c = &self.cfg;
        let d = c.d_model;
        let mut w = GgufWriter::new();
        for (k, v) in c.metadata() {
            w.set(k, v);
        }
        w.set(
            "general.name",
            Value::String(format!("DSpark drafter for {} ({} layers, width {d}), block {}", id.arch, id.n_layer, c.block_size)),
        );
        for (k, v) in id.metadata(KIND) {
            w.set(k, v);
        }
        w.set(keys::VOCAB, Value::U32(id.vocab as u32));
        for k in TOKENIZER_KEYS {
            if let Some(v) = target.get(k) {
                w.set(k, v.clone());
            }
        }
        for (k, v) in extra {
            w.set(k.clone(), v.clone());
        }
        let vec_t = |name: String, v: &[f32]| TensorData {
            name,
            dims: vec![v.len() as u64],
            ty: GgmlType::F32,
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        let mat_t = |name: String, v: &[f32], o: usize, i: usize, ty: GgmlType| -> Result<TensorData, GgufError> {
            let mut data = Vec::new();
            for r in v.chunks_exact(i) {
                data.extend(
                    tandem_kernels::quant::quantize::quantize_row(ty, r)
                        .ok_or_else(|| GgufError::Write(format!("{name}: cannot quantize rows of {i} to {ty}")))?,
                );
            }
            Ok(TensorData { name, dims: vec![i as u64, o as u64], ty, data })
        };
        let m = c.target_layers.len();
        w.add_tensor(mat_t("fc.weight".into(), &self.fc, d, m * d, ty)?)?;
        w.add_tensor(vec_t("enc.output_norm.weight".into(), &self.enc_norm))?;
        for (n, b) in self.blocks.iter().enumerate() {
            for (name, v) in &b.tensors {
                let (o, i) = c.block_shape(name);
                if i == 1 {
                    w.add_tensor(vec_t(format!("blk.{n}.{name}"), v))?;
                } else {
                    w.add_tensor(mat_t(format!("blk.{n}.{name}"), v, o, i, ty)?)?;
                }
            }
        }
        w.add_tensor(vec_t("output_norm.weight".into(), &self.output_norm))?;
        if let Some(o) = &self.output {
            w.add_tensor(mat_t("output.weight".into(), o, c.draft_vocab, d, ty)?)?;
        }
        if let Some(m) = &self.d2t {
            w.add_tensor(TensorData {
                name: "d2t".into(),
                dims: vec![m.len() as u64],
                ty: GgmlType::I64,
                data: m.iter().flat_map(|&x| (x as i64).to_le_bytes()).collect(),
            })?;
        }
        let r = c.markov_rank;
        w.add_tensor(mat_t("markov_w1.weight".into(), &self.markov_w1, id.vocab, r, ty)?)?;
        w.add_tensor(mat_t("markov_w2.weight".into(), &self.markov_w2, c.draft_vocab, r, ty)?)?;
        if let Some((cw, cb)) = &self.conf {
            w.add_tensor(mat_t("conf_proj.weight".into(), cw, 1, d + r, GgmlType::F32)?)?;
            w.add_tensor(vec_t("conf_proj.bias".into(), &[*cb]))?;
        }
        Ok(w)
    }

    /// Read a DSpark file back as f32 (to continue training, or to test).
    pub fn from_gguf(g: &Gguf, target: &crate::Config) -> Result<Self, SupportError> {
        let cfg = DSparkConfig::from_gguf(g, target)?;
        let kind = SupportKind::DSpark;
        // the trainer's forward is tandem's layout only
        let (backbone, _) = Backbone::from_gguf(g, &cfg, target)?;
        let own_embd = g.tensor_info("token_embd.weight").is_some();
        let extra = (0..cfg.n_layer).any(|n| {
            g.tensor_info(&format!("blk.{n}.attn_v.weight")).is_none()
                || OPTIONAL_BLOCK_TENSORS.iter().any(|t| g.tensor_info(&format!("blk.{n}.{t}")).is_some())
        });
        if !cfg.has_markov() || !backbone.is_plain(cfg.head_dim) || own_embd || extra || g.tensor_info("rope_freqs.weight").is_some() {
            return Err(SupportError::Metadata {
                kind,
                msg: "only files in tandem's own layout (a Markov head and the plain backbone) can be read for training".into(),
            });
        }
        let terr = |e: ModelError| SupportError::Tensor(kind, e);
        let d = cfg.d_model;
        let m = cfg.target_layers.len();
        let r = cfg.markov_rank;
        let blocks = (0..cfg.n_layer)
            .map(|n| {
                Ok(DSparkBlockWeights {
                    tensors: BLOCK_TENSORS
                        .iter()
                        .map(|t| {
                            let (o, i) = cfg.block_shape(t);
                            Ok((t.to_string(), dequant(g, &format!("blk.{n}.{t}"), o * i).map_err(terr)?))
                        })
                        .collect::<Result<Vec<_>, SupportError>>()?,
                })
            })
            .collect::<Result<Vec<_>, SupportError>>()?;
        let output = match g.tensor_info("output.weight") {
            Some(_) => Some(dequant(g, "output.weight", cfg.draft_vocab * d).map_err(terr)?),
            None => None,
        };
        let d2t = match g.tensor("d2t") {
            Ok((t, data)) => Some(read_ids(t.ty, data).unwrap_or_default().into_iter().map(|x| x as u32).collect()),
            Err(_) => None,
        };
        let conf = if cfg.has_conf {
            let w = dequant(g, "conf_proj.weight", d + r).map_err(terr)?;
            let b = if g.tensor_info("conf_proj.bias").is_some() { dequant(g, "conf_proj.bias", 1).map_err(terr)?[0] } else { 0.0 };
            Some((w, b))
        } else {
            None
        };
        Ok(DSparkWeights {
            fc: dequant(g, "fc.weight", d * m * d).map_err(terr)?,
            enc_norm: dequant(g, "enc.output_norm.weight", d).map_err(terr)?,
            blocks,
            output_norm: dequant(g, "output_norm.weight", d).map_err(terr)?,
            output,
            d2t,
            markov_w1: dequant(g, "markov_w1.weight", target.vocab * r).map_err(terr)?,
            markov_w2: dequant(g, "markov_w2.weight", cfg.draft_vocab * r).map_err(terr)?,
            conf,
            cfg,
        })
    }
}

/// The FFN gate activation of a DFlash backbone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (tandem's files, and llama.cpp's default).
    Silu,
    /// GeGLU with gelu's tanh approximation (llama.cpp maps `gelu` and
    /// `gelu_pytorch_tanh` both to it).
    Gelu,
}

/// How llama.cpp's DFlash graph runs a file's backbone, from the keys and
/// tensors beyond tandem's own layout. Kept apart from [`DSparkConfig`]
/// (which the trainer builds) because tandem's trainer only writes the
/// default, [`Backbone::PLAIN`]: the loader reads these so that a file
/// converted by llama.cpp drafts with the meaning llama.cpp gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Backbone {
    /// `dflash.attention.causal`: slot i sees the block's slots ≤ i only
    /// (default: every slot sees the whole block).
    pub causal: bool,
    /// `dflash.embedding_scale`: the block's token embeddings are
    /// multiplied by it (0: not scaled).
    pub embedding_scale: f32,
    /// `dflash.attention.scale`: the attention logits' scale (0: 1/√head_dim).
    pub attn_scale: f32,
    /// `dflash.attention.value_scale`: the attention output (after its
    /// projection) is multiplied by it (0: not scaled).
    pub value_scale: f32,
    pub activation: Activation,
    /// `dflash.rope.dimension_count`: the leading dimensions of each head
    /// that RoPE rotates (NeoX pairs `j, j + n_rot/2`); the rest pass.
    pub n_rot: usize,
    /// Position factor of linear RoPE scaling (1 / `rope.scaling.factor`).
    pub rope_freq_scale: f32,
    /// `dflash.attention.sliding_window` (0: none): on the layers
    /// `sliding[l]` marks, a slot at position q sees keys at positions k
    /// with `q − k < window` (later block slots stay visible).
    pub sliding_window: usize,
    pub sliding: Vec<bool>,
}

impl Backbone {
    /// tandem's own layout: SwiGLU, NeoX RoPE over the full head, no
    /// scales, non-causal, no window.
    pub const PLAIN: Backbone = Backbone {
        causal: false,
        embedding_scale: 0.0,
        attn_scale: 0.0,
        value_scale: 0.0,
        activation: Activation::Silu,
        n_rot: 0,
        rope_freq_scale: 1.0,
        sliding_window: 0,
        sliding: Vec::new(),
    };

    /// Whether this is the layout tandem's trainer writes (`n_rot` the
    /// head dimension).
    pub fn is_plain(&self, head_dim: usize) -> bool {
        *self == Backbone { n_rot: head_dim, sliding: self.sliding.clone(), ..Backbone::PLAIN } && self.sliding_window == 0
    }

    /// Whether layer `l` uses the sliding window.
    pub fn is_sliding(&self, l: usize) -> bool {
        self.sliding_window > 0 && self.sliding.get(l).copied().unwrap_or(false)
    }

    /// Read the backbone options of `g` (whose configuration is `cfg`),
    /// refusing what tandem cannot run as llama.cpp would: another
    /// drafter family (DFlash2, DeepSeek-V4, mixture of experts), a RoPE
    /// scaling other than none/linear, an activation llama.cpp refuses, and
    /// any tensor that is not part of the DFlash/DSpark layout. Returns
    /// warnings for what loads but would not run in llama.cpp.
    pub fn from_gguf(g: &Gguf, cfg: &DSparkConfig, target: &crate::Config) -> Result<(Self, Vec<String>), SupportError> {
        let kind = SupportKind::DSpark;
        let meta = |msg: String| SupportError::Metadata { kind, msg };
        let unsupported = |msg: String| SupportError::Metadata { kind, msg: format!("not supported: {msg}") };
        let nonzero = |key: &str| g.get(key).is_some_and(|v| v.as_f64().is_none_or(|x| x != 0.0));
        if nonzero(keys::HYPER_CONNECTIONS) {
            return Err(unsupported(format!(
                "{} > 0 selects the DeepSeek-V4 DSpark backbone (hyper-connections, MLA, mixture of experts)",
                keys::HYPER_CONNECTIONS
            )));
        }
        if let Some(k) = keys::DFLASH2.iter().find(|k| nonzero(k)) {
            return Err(unsupported(format!("{k} belongs to a DFlash2 drafter (dynamic convolutions and a selector lattice)")));
        }
        if nonzero(keys::EXPERTS) {
            return Err(unsupported(format!("{} (a mixture-of-experts backbone)", keys::EXPERTS)));
        }
        let mut warnings = Vec::new();
        for t in &g.tensors {
            tensor_allowed(&t.name, cfg.n_layer)
                .map_err(|why| SupportError::Metadata { kind, msg: format!("DSpark tensor not supported: {} ({why})", t.name) })?;
        }
        let float = |key: &str| -> Result<f32, SupportError> {
            match g.get(key) {
                None => Ok(0.0),
                Some(v) => match v.as_f64() {
                    Some(x) if x.is_finite() => Ok(x as f32),
                    _ => Err(meta(format!("{key} is not a finite number"))),
                },
            }
        };
        let causal = match g.get(keys::CAUSAL) {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(meta(format!("{} is not a boolean", keys::CAUSAL))),
        };
        let activation = match g.get(keys::ACTIVATION) {
            None => Activation::Silu,
            Some(Value::String(s)) if s == "silu" => Activation::Silu,
            Some(Value::String(s)) if s == "gelu" || s == "gelu_pytorch_tanh" => Activation::Gelu,
            Some(Value::String(s)) => {
                return Err(unsupported(format!("{} {s:?} (silu, gelu and gelu_pytorch_tanh are)", keys::ACTIVATION)))
            }
            Some(_) => return Err(meta(format!("{} is not a string", keys::ACTIVATION))),
        };
        let hd = cfg.head_dim;
        let n_rot = match g.get(keys::ROPE_DIMS) {
            None => hd,
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 && n as usize <= hd && n % 2 == 0 => n as usize,
                _ => return Err(meta(format!("{} must be an even number in 2..={hd}", keys::ROPE_DIMS))),
            },
        };
        match crate::support::int_array(g, keys::ROPE_SECTIONS, kind)? {
            None => {}
            // text positions are (p, p, p, 0): sections 0..3 rotate as NeoX does
            Some(s)
                if s.len() == 4
                    && s[3] == 0
                    && s.iter().all(|&x| x >= 0)
                    && s.iter().any(|&x| x != 0)
                    && g.tensor_info("rope_freqs.weight").is_some() =>
            {
                return Err(unsupported(format!("rope_freqs.weight with {} (llama.cpp's M-RoPE path ignores it)", keys::ROPE_SECTIONS)));
            }
            Some(s) if s.len() == 4 && s[3] == 0 && s.iter().all(|&x| x >= 0) => {}
            Some(s) => {
                return Err(unsupported(format!("{} {s:?} (only a zero fourth section rotates as plain text)", keys::ROPE_SECTIONS)))
            }
        }
        match g.get(keys::ROPE_SCALING) {
            None => {}
            Some(Value::String(s)) if s == "none" || s == "linear" => {}
            Some(Value::String(s)) => return Err(unsupported(format!("{} {s:?} (none and linear are)", keys::ROPE_SCALING))),
            Some(_) => return Err(meta(format!("{} is not a string", keys::ROPE_SCALING))),
        }
        let attn_factor = float(keys::ROPE_ATTN_FACTOR)?;
        if attn_factor != 0.0 && attn_factor != 1.0 {
            return Err(unsupported(format!("{} {attn_factor}", keys::ROPE_ATTN_FACTOR)));
        }
        // llama.cpp reads the factor whatever the scaling type (none scales too)
        let factor = match float(keys::ROPE_FACTOR)? {
            0.0 => float(keys::ROPE_SCALE_LINEAR)?,
            f => f,
        };
        if factor < 0.0 {
            return Err(meta(format!("rope scaling factor {factor}")));
        }
        let rope_freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
        let sliding_window = g
            .get(keys::SLIDING_WINDOW)
            .map_or(Some(0), |v| v.as_u64())
            .ok_or_else(|| meta(format!("{} is not a non-negative integer", keys::SLIDING_WINDOW)))? as usize;
        let sliding = if sliding_window > 0 {
            match g.get(keys::SLIDING_PATTERN) {
                Some(Value::Array(_, items)) if items.len() <= cfg.n_layer => items
                    .iter()
                    .map(|v| match v {
                        Value::Bool(b) => Ok(*b),
                        _ => Err(meta(format!("{} holds a value that is not a boolean", keys::SLIDING_PATTERN))),
                    })
                    .collect::<Result<Vec<bool>, _>>()?,
                Some(Value::Array(_, items)) => {
                    return Err(meta(format!("{} has {} entries for {} layers", keys::SLIDING_PATTERN, items.len(), cfg.n_layer)))
                }
                Some(_) => return Err(meta(format!("{} is not an array", keys::SLIDING_PATTERN))),
                None => return Err(meta(format!("{} > 0 needs {}", keys::SLIDING_WINDOW, keys::SLIDING_PATTERN))),
            }
        } else {
            Vec::new()
        };
        let b = Backbone {
            causal,
            embedding_scale: float(keys::EMBED_SCALE)?,
            attn_scale: float(keys::ATTN_SCALE)?,
            value_scale: float(keys::VALUE_SCALE)?,
            activation,
            n_rot,
            rope_freq_scale,
            sliding_window,
            sliding,
        };
        if let Some(&l) = cfg.target_layers.iter().find(|&&l| l >= target.n_layer) {
            warnings.push(format!(
                "{} holds {l}, the output of the target's last layer: tandem runs it, but llama.cpp extracts layer inputs only and cannot for most targets",
                keys::TARGET_LAYERS
            ));
        }
        Ok((b, warnings))
    }
}

/// Whether a tensor named `name` belongs to a DFlash/DSpark file with
/// `n_layer` backbone layers (Err: why not, for the refusal).
fn tensor_allowed(name: &str, n_layer: usize) -> Result<(), &'static str> {
    if TOP_TENSORS.contains(&name) {
        return Ok(());
    }
    if name.starts_with("selector_") || name.contains("_conv_") {
        return Err("a DFlash2 convolution/selector tensor");
    }
    if name.starts_with("hc_") || name.contains(".hc_") || name.contains("_exps") || name.contains("_shexp") || name.contains("attn_kv") {
        return Err("a DeepSeek-V4 backbone tensor");
    }
    if name.ends_with(".scale") || name.ends_with(".input_scale") {
        return Err("a per-tensor scale, written with NVFP4 weights");
    }
    if let Some(rest) = name.strip_prefix("blk.") {
        if let Some((n, t)) = rest.split_once('.') {
            if n.parse::<usize>().is_ok_and(|n| n < n_layer) && (BLOCK_TENSORS.contains(&t) || OPTIONAL_BLOCK_TENSORS.contains(&t)) {
                return Ok(());
            }
        }
    }
    Err("not part of the DFlash/DSpark layout")
}
