//! Small random models written as GGUF images, for tests: property tests
//! of batch invariance and speculative exactness run on these in
//! milliseconds. Llama-shaped by default; Gemma-3-shaped (Q/K norms, post
//! norms, GeGLU, head size twice width/heads, local layers with a sliding
//! window) with `window` set.

use tandem_gguf::{GgmlType, GgufWriter, TensorData, Value};
use tandem_kernels::quant::quantize::quantize_row;

/// Shape and weight type of a synthetic model.
#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    pub n_layer: usize,
    pub d_model: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub ctx: usize,
    pub ty: GgmlType,
    pub tied: bool,
    pub seed: u64,
    /// A `gemma3` model whose even layers attend over a sliding window of
    /// this many positions (odd layers are global).
    pub window: Option<usize>,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        SyntheticSpec {
            n_layer: 2,
            d_model: 64,
            n_head: 4,
            n_kv_head: 2,
            ffn: 128,
            vocab: 320,
            ctx: 512,
            ty: GgmlType::Q8_0,
            tied: true,
            seed: 1,
            window: None,
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// A GGUF image of a random llama (or, with `window`, gemma3) model with a
/// byte-level vocabulary (tokens 0..3 are specials, then the 256 bytes,
/// then filler tokens).
pub fn synthetic_llama(spec: &SyntheticSpec) -> Vec<u8> {
    let s = spec;
    let mut rng = Rng(s.seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
    let mut w = GgufWriter::new();
    let a = if s.window.is_some() { "gemma3" } else { "llama" };
    let hd = if s.window.is_some() { 2 * s.d_model / s.n_head } else { s.d_model / s.n_head };
    if let Some(win) = s.window {
        w.set(format!("{a}.attention.sliding_window"), Value::U32(win as u32));
        w.set(format!("{a}.attention.sliding_window_pattern"), Value::U32(2));
        w.set(format!("{a}.attention.key_length"), Value::U32(hd as u32));
        w.set(format!("{a}.attention.value_length"), Value::U32(hd as u32));
        w.set(format!("{a}.rope.freq_base_swa"), Value::F32(100.0));
    }
    w.set("general.architecture", Value::String(a.into()));
    w.set("general.name", Value::String("synthetic".into()));
    w.set(format!("{a}.block_count"), Value::U32(s.n_layer as u32));
    w.set(format!("{a}.embedding_length"), Value::U32(s.d_model as u32));
    w.set(format!("{a}.feed_forward_length"), Value::U32(s.ffn as u32));
    w.set(format!("{a}.attention.head_count"), Value::U32(s.n_head as u32));
    w.set(format!("{a}.attention.head_count_kv"), Value::U32(s.n_kv_head as u32));
    w.set(format!("{a}.context_length"), Value::U32(s.ctx as u32));
    w.set(format!("{a}.rope.freq_base"), Value::F32(10000.0));
    w.set(format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
    w.set(format!("{a}.vocab_size"), Value::U32(s.vocab as u32));
    // a byte-level gpt2 vocabulary so a tokenizer can be built too
    let mut tokens = vec!["<|endoftext|>".to_string(), "<|im_start|>".into(), "<|im_end|>".into(), "<pad>".into()];
    let mut types = vec![3i32; 4];
    for b in 0..=255u8 {
        tokens.push(gpt2_byte_char(b).to_string());
        types.push(1);
    }
    let mut i = 0;
    while tokens.len() < s.vocab {
        tokens.push(format!("<extra_{i}>"));
        types.push(4);
        i += 1;
    }
    tokens.truncate(s.vocab);
    types.truncate(s.vocab);
    w.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.set("tokenizer.ggml.pre", Value::String("gpt-2".into()));
    w.set("tokenizer.ggml.tokens", Value::Array(tandem_gguf::ValueType::String, tokens.into_iter().map(Value::String).collect()));
    w.set("tokenizer.ggml.token_type", Value::Array(tandem_gguf::ValueType::I32, types.into_iter().map(Value::I32).collect()));
    w.set("tokenizer.ggml.merges", Value::Array(tandem_gguf::ValueType::String, vec![]));
    w.set("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.set("tokenizer.ggml.eos_token_id", Value::U32(2));

    let ws = 1.0 / (s.d_model as f32).sqrt() * 1.7;
    mat(&mut rng, &mut w, "token_embd.weight", s.d_model, s.vocab, 1.0, s.ty);
    if !s.tied {
        mat(&mut rng, &mut w, "output.weight", s.d_model, s.vocab, ws, s.ty);
    }
    vecf(&mut rng, &mut w, "output_norm.weight", s.d_model);
    for l in 0..s.n_layer {
        vecf(&mut rng, &mut w, &format!("blk.{l}.attn_norm.weight"), s.d_model);
        vecf(&mut rng, &mut w, &format!("blk.{l}.ffn_norm.weight"), s.d_model);
        if s.window.is_some() {
            vecf(&mut rng, &mut w, &format!("blk.{l}.attn_q_norm.weight"), hd);
            vecf(&mut rng, &mut w, &format!("blk.{l}.attn_k_norm.weight"), hd);
            vecf(&mut rng, &mut w, &format!("blk.{l}.post_attention_norm.weight"), s.d_model);
            vecf(&mut rng, &mut w, &format!("blk.{l}.post_ffw_norm.weight"), s.d_model);
        }
    }
    for l in 0..s.n_layer {
        let n = |x: &str| format!("blk.{l}.{x}.weight");
        mat(&mut rng, &mut w, &n("attn_q"), s.d_model, s.n_head * hd, ws, s.ty);
        mat(&mut rng, &mut w, &n("attn_k"), s.d_model, s.n_kv_head * hd, ws, s.ty);
        mat(&mut rng, &mut w, &n("attn_v"), s.d_model, s.n_kv_head * hd, ws, s.ty);
        mat(&mut rng, &mut w, &n("attn_output"), s.n_head * hd, s.d_model, ws, s.ty);
        mat(&mut rng, &mut w, &n("ffn_gate"), s.d_model, s.ffn, ws, s.ty);
        mat(&mut rng, &mut w, &n("ffn_up"), s.d_model, s.ffn, ws, s.ty);
        mat(&mut rng, &mut w, &n("ffn_down"), s.ffn, s.d_model, 1.0 / (s.ffn as f32).sqrt() * 1.7, s.ty);
    }
    w.to_bytes().expect("valid synthetic model")
}

/// GPT-2's printable stand-in for a raw byte.
fn gpt2_byte_char(b: u8) -> char {
    let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable {
        return b as char;
    }
    // non-printable bytes map to 256.. in order
    let mut n = 0u32;
    for c in 0..b {
        let p = (b'!'..=b'~').contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c);
        if !p {
            n += 1;
        }
    }
    char::from_u32(256 + n).unwrap()
}

fn mat(rng: &mut Rng, w: &mut GgufWriter, name: &str, k: usize, n: usize, scale: f32, ty: GgmlType) {
    let x: Vec<f32> = (0..k * n).map(|_| rng.next() * scale).collect();
    let data = quantize_row(ty, &x).expect("quantizable type");
    w.add_tensor(TensorData { name: name.into(), dims: vec![k as u64, n as u64], ty, data }).unwrap();
}

fn vecf(rng: &mut Rng, w: &mut GgufWriter, name: &str, n: usize) {
    let x: Vec<f32> = (0..n).map(|_| 1.0 + 0.1 * rng.next()).collect();
    let data = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.add_tensor(TensorData { name: name.into(), dims: vec![n as u64], ty: GgmlType::F32, data }).unwrap();
}
