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

/// Hyper-parameters of a llama-family model, read from GGUF metadata.
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
}

impl Config {
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn from_gguf(g: &Gguf) -> Result<Self, ModelError> {
        let arch = g.get_str("general.architecture")?.to_string();
        let rope_style = match arch.as_str() {
            "llama" | "mistral" => RopeStyle::Pairs,
            "qwen2" => RopeStyle::Halves,
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
        if n_head % n_kv_head != 0 || d_model % n_head != 0 {
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
        if head_dim == 0 || head_dim % 2 != 0 || rope_dim > head_dim || rope_dim % 2 != 0 {
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
        Ok(Config {
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
