use tandem_gguf::Gguf;

use crate::ModelError;

/// How RoPE pairs up dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// (x[2i], x[2i+1]) — llama, mistral (GGUF weights are permuted for this).
    Pairs,
    /// (x[i], x[i+d/2]) — qwen2 ("neox").
    Halves,
}

/// The feed-forward's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) · up (llama, qwen2).
    SwiGlu,
    /// gelu(gate) · up with gelu's tanh approximation (gemma).
    GeGlu,
}

/// Hyper-parameters of a decoder-only transformer (llama, mistral, qwen2,
/// gemma3), read from GGUF metadata.
#[derive(Debug, Clone)]
pub struct Config {
    pub arch: String,
    pub n_layer: usize,
    pub d_model: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub ctx_train: usize,
    pub rope_base: f32,
    pub rope_dim: usize,
    pub rope_scale: f32,
    pub rope_style: RopeStyle,
    pub eps: f32,
    /// Embedding rows are multiplied by this (√width for gemma, else 1).
    pub embed_scale: f32,
    /// Attention scores are `q·k · attn_scale`.
    pub attn_scale: f32,
    pub act: Activation,
    /// Sliding-window size of the local layers (a row at position p attends
    /// to positions p − window + 1 ..= p), or 0 when every layer is global.
    pub window: usize,
    /// Per layer: whether it attends over the sliding window only.
    pub local: Vec<bool>,
    /// RoPE base of the local layers (their frequency scale is 1).
    pub rope_base_local: f32,
    /// Logits become `cap · tanh(logit / cap)` when set.
    pub logit_softcap: Option<f32>,
}

impl Config {
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The sliding window of layer `l`, if it is a local layer.
    pub fn layer_window(&self, l: usize) -> Option<usize> {
        (self.window > 0 && self.local.get(l).copied().unwrap_or(false)).then_some(self.window)
    }

    /// Whether any layer attends over a sliding window.
    pub fn has_window(&self) -> bool {
        (0..self.n_layer).any(|l| self.layer_window(l).is_some())
    }

    pub fn from_gguf(g: &Gguf) -> Result<Self, ModelError> {
        let arch = g.get_str("general.architecture")?.to_string();
        let rope_style = match arch.as_str() {
            "llama" | "mistral" => RopeStyle::Pairs,
            "qwen2" | "gemma3" => RopeStyle::Halves,
            _ => return Err(ModelError::UnsupportedArch(arch)),
        };
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| -> Result<usize, ModelError> { Ok(g.get_u64(&key(k))? as usize) };
        let n_layer = u("block_count")?;
        let d_model = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let n_kv_head = if g.get(&key("attention.head_count_kv")).is_some() { u("attention.head_count_kv")? } else { n_head };
        let ffn = u("feed_forward_length")?;
        let ctx_train = u("context_length")?;
        if n_layer == 0 || n_layer > 1024 || d_model == 0 || d_model > 1 << 16 || n_head == 0 || n_kv_head == 0 {
            return Err(ModelError::BadConfig(format!(
                "implausible sizes: {n_layer} layers, width {d_model}, {n_head} heads, {n_kv_head} kv heads"
            )));
        }
        let gemma = arch == "gemma3";
        if n_head % n_kv_head != 0 || (!gemma && d_model % n_head != 0) {
            return Err(ModelError::BadConfig(format!("{n_head} heads / {n_kv_head} kv heads / width {d_model} do not divide")));
        }
        let head_dim = match g.get(&key("attention.key_length")) {
            Some(v) => v.as_u64().unwrap_or(0) as usize,
            None => d_model / n_head,
        };
        let rope_dim = match g.get(&key("rope.dimension_count")) {
            Some(v) => v.as_u64().unwrap_or(head_dim as u64) as usize,
            None => head_dim,
        };
        if head_dim == 0 || head_dim > 4096 || head_dim % 2 != 0 || rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(ModelError::BadConfig(format!("head dim {head_dim}, rope dim {rope_dim}")));
        }
        let rope_base = g.get(&key("rope.freq_base")).and_then(|v| v.as_f64()).unwrap_or(10000.0) as f32;
        let rope_scale = match g.get(&key("rope.scaling.factor")).and_then(|v| v.as_f64()) {
            Some(f) if f > 0.0 => 1.0 / f as f32,
            _ => 1.0,
        };
        let eps = g.get(&key("attention.layer_norm_rms_epsilon")).and_then(|v| v.as_f64()).unwrap_or(1e-5) as f32;
        let vocab = match g.get(&key("vocab_size")).and_then(|v| v.as_u64()) {
            Some(v) => v as usize,
            None => g.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let f = |k: &str| g.get(&key(k)).and_then(|v| v.as_f64());
        // gemma3: local layers with a sliding window, every `pattern`-th
        // layer global (llama.cpp's `set_swa_pattern`, dense last)
        let (window, local, rope_base_local) = if gemma {
            let window = g.get(&key("attention.sliding_window")).and_then(|v| v.as_u64()).unwrap_or(0) as usize;
            let pattern = g.get(&key("attention.sliding_window_pattern"));
            let local: Vec<bool> = match pattern.and_then(|v| v.as_array()) {
                // one flag per layer
                Some(flags) => {
                    if flags.len() != n_layer {
                        return Err(ModelError::BadConfig(format!(
                            "sliding_window_pattern has {} flags for {n_layer} layers",
                            flags.len()
                        )));
                    }
                    flags.iter().map(|v| window > 0 && v.as_bool().unwrap_or(false)).collect()
                }
                None => {
                    let p = pattern.and_then(|v| v.as_u64()).unwrap_or(6) as usize;
                    (0..n_layer).map(|l| window > 0 && (p == 0 || l % p < p - 1)).collect()
                }
            };
            (window, local, f("rope.freq_base_swa").unwrap_or(10000.0) as f32)
        } else {
            (0, vec![false; n_layer], rope_base)
        };
        let logit_softcap = f("final_logit_softcapping").filter(|c| *c > 0.0).map(|c| c as f32);
        Ok(Config {
            embed_scale: if gemma { (d_model as f32).sqrt() } else { 1.0 },
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            act: if gemma { Activation::GeGlu } else { Activation::SwiGlu },
            window,
            local,
            rope_base_local,
            logit_softcap,
            arch,
            n_layer,
            d_model,
            n_head,
            n_kv_head,
            head_dim,
            ffn,
            vocab,
            ctx_train,
            rope_base,
            rope_dim,
            rope_scale,
            rope_style,
            eps,
        })
    }
}
